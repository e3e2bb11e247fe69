"""Image → local environment, for the process runtime (which runs commands on the host, like Slurm without
containers).

A run names a container image (`pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime`). The process runtime does not
pull images: each agent maps image names to a local environment folder (a Python venv or conda env, any
prefix with a bin/), whose bin/ is put first on the worker's PATH (and VIRTUAL_ENV set when it is a venv).

The map is an ordered list of (glob, environment dir), first match wins, globs as fnmatch:
  ASTRAEUS_IMAGE_MAP='{"pytorch/*": "/opt/envs/torch", "nvcr.io/nvidia/pytorch:*": "/opt/envs/torch", "*": "host"}'
ASTRAEUS_IMAGE_MAP may also be the path of a JSON file with the same object; ASTRAEUS_IMAGE_MAP_FILE too.
The value "host" means the agent's own PATH unchanged. With no map, or no match, every image maps to the
agent's own Python environment (sys.prefix). The environment used is reported with the worker's state.

Pure (the standard library only): astraeus.settings checks ASTRAEUS_IMAGE_MAP with it, and the agent's runtime
(astraeus.agent.runtime.images) uses it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalEnvironment:
    path: str | None  # None: the agent's PATH unchanged ("host")

    @property
    def name(self) -> str:
        return self.path or "host"

    def apply(self, env: dict[str, str]) -> None:
        """Put this environment first on env["PATH"]."""
        if not self.path:
            return
        # The real path: a worker's view shows the environment at its real path (a venv reached through a
        # symlink, say from a folder the view hides, is bound back where it really is).
        env["PATH"] = os.path.join(os.path.realpath(self.path), "bin") + os.pathsep + env.get("PATH", os.defpath)
        if os.path.exists(os.path.join(self.path, "pyvenv.cfg")):
            env.setdefault("VIRTUAL_ENV", self.path)


class ImageMap:
    def __init__(self, rules: Mapping[str, str] | list[tuple[str, str]] | None = None, default: str | None = None):
        items = list(rules.items()) if isinstance(rules, Mapping) else list(rules or [])
        self.rules: list[tuple[str, str]] = [(str(g), str(d)) for g, d in items]
        self.default = default if default is not None else sys.prefix

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ImageMap:
        """From the variables in `environ` (the agent's own: astraeus.settings.AgentSettings.images())."""
        return cls.load(environ.get("ASTRAEUS_IMAGE_MAP"), environ.get("ASTRAEUS_IMAGE_MAP_FILE"))

    @classmethod
    def load(cls, raw: str | None, path: str | None) -> ImageMap:
        """From ASTRAEUS_IMAGE_MAP's value (a JSON object, or a file's path) and ASTRAEUS_IMAGE_MAP_FILE's.
        Raises OSError (an unreadable file) or ValueError (not a JSON object of strings)."""
        raw, path = (raw or "").strip(), (path or "").strip()
        if raw and not raw.startswith("{"):
            path, raw = raw, ""
        if path:
            with open(path) as f:
                raw = f.read()
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            raise ValueError("not valid JSON") from None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise ValueError("ASTRAEUS_IMAGE_MAP must be a JSON object {image glob: environment dir}")
        return cls(data)

    def resolve(self, image: str | None) -> LocalEnvironment:
        image = image or ""
        for glob, target in self.rules:
            if fnmatch.fnmatchcase(image, glob):
                return LocalEnvironment(None if target in ("host", "") else target)
        return LocalEnvironment(self.default)
