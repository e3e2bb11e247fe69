"""Image references, read as Docker reads them (stdlib only: the API, the agent and its shim use it).

  pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime   docker.io/pytorch/pytorch, tag 2.4.1-…
  ubuntu                                           docker.io/library/ubuntu:latest (Docker Hub's short names)
  nvcr.io/nvidia/pytorch:24.08-py3                 registry nvcr.io
  127.0.0.1:5000/team/eval:1                       registry 127.0.0.1:5000 (a port, or a dot, or localhost)
  busybox@sha256:<64 hex>                          pinned to that manifest digest (a tag beside it is kept
                                                   for display, the digest decides)

`ImageRef.parse` raises ValueError with what to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's images are really served
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_DOMAIN = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                     r"|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?$")


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port] as written (docker.io for Docker Hub)
    repository: str  # library/ubuntu, pytorch/pytorch
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        raw = (text or "").strip()
        if not raw:
            raise ValueError("the image is empty: name one, such as pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime")
        if len(raw) > 512 or any(c.isspace() for c in raw):
            raise ValueError(f"image {raw!r} is not an image reference: no spaces, at most 512 characters")
        name, digest = raw, None
        if "@" in raw:
            name, _, digest = raw.partition("@")
            if not _DIGEST.match(digest):
                raise ValueError(f"image {raw!r}: the digest must be sha256: and 64 lowercase hex digits")
        tag = None
        slash, colon = name.rfind("/"), name.rfind(":")
        if colon > slash:
            name, tag = name[:colon], name[colon + 1:]
            if not _TAG.match(tag):
                raise ValueError(f"image {raw!r}: the tag {tag!r} may hold letters, digits, '_', '.' and '-' "
                                 "(at most 128, not starting with '.' or '-')")
        first, sep, rest = name.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
            registry, repository = first, rest
            if not _DOMAIN.match(registry):
                raise ValueError(f"image {raw!r}: {registry!r} is not a registry host[:port]")
        else:
            registry, repository = DOCKER_HUB, name
        if registry in ("index.docker.io", "registry-1.docker.io"):
            registry = DOCKER_HUB
        if registry == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        if not _REPOSITORY.match(repository):
            raise ValueError(f"image {raw!r}: the name {repository!r} may hold lowercase letters, digits and "
                             "'.', '_', '-' between '/'-separated parts")
        if tag is None and digest is None:
            tag = "latest"
        return cls(registry, repository, tag, digest)

    @property
    def api_host(self) -> str:
        """The host[:port] that serves the registry's API (Docker Hub's is registry-1.docker.io)."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def name(self) -> str:
        """registry/repository, the fully qualified name (docker.io/library/ubuntu)."""
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    @property
    def transport(self) -> str:
        """The reference as skopeo's docker:// transport takes it (by digest when pinned; skopeo serves docker.io itself)."""
        return f"docker://{self.registry}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")


def registry_of(image: str) -> str | None:
    """The registry an image is pulled from (docker.io for Docker Hub's names), or None if it is not valid."""
    try:
        return ImageRef.parse(image).registry
    except ValueError:
        return None
