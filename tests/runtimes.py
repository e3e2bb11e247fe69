"""The two runtimes the agent can use, for tests that hold on both (issue 14): "process" (the command on the host)
and "container" (runc, from the python test image pushed to the session's local registry).

  KINDS                      ["process", "container"]: the ids of parametrised tests
  container_skip_reason()    why the container variant cannot run here (tools missing, not root), or None
  Containers                 the session's container setup (tests/conftest.py `containers` fixture):
      .image                 "127.0.0.1:PORT/test/python:3.11" (has `python`, `sh`, Debian's minbase)
      .registry              "127.0.0.1:PORT" (plain HTTP: listed insecure)
      .cache_dir             an image cache shared by the session's runtimes and agents, the image already
                             pulled into it, so no test waits for a pull (pulls are tested in tests/containers)
      .runtime(state_dir, stop_grace, **kw)   a ContainerRuntime using them
      .agent_env()           the environment an `astraeus agent` / `astraeus up` needs to run containers
  runtime_env(kind, containers)   the agent environment of a kind ({"ASTRAEUS_RUNTIME": "process"} or the above)
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

KINDS = ["process", "container"]


def container_skip_reason() -> str | None:
    from astraeus.agent.runtime.container import container_tools_missing
    from tests import oci

    missing = container_tools_missing() + [t for t in oci.tools_missing() if t not in container_tools_missing()]
    if missing:
        return f"the container runtime's tools are not installed: {', '.join(missing)} (make system-deps)"
    if os.geteuid() != 0:
        return "the container runtime needs root"
    if shutil.which("runc") is None:
        return "runc is not installed"
    return None


@dataclass
class Containers:
    image: str
    registry: str
    cache_dir: str

    def runtime(self, state_dir: str, stop_grace: float = 2.0, **kw):
        from astraeus.agent.runtime.container import ContainerRuntime

        return ContainerRuntime(str(state_dir), stop_grace=stop_grace, image_cache_dir=self.cache_dir,
                                insecure_registries=[self.registry], **kw)

    def agent_env(self) -> dict[str, str]:
        return {"ASTRAEUS_RUNTIME": "container", "ASTRAEUS_INSECURE_REGISTRIES": self.registry,
                "ASTRAEUS_IMAGE_CACHE_DIR": self.cache_dir}


def runtime_env(kind: str, containers: Containers | None) -> dict[str, str]:
    if kind == "container":
        assert containers is not None
        return containers.agent_env()
    return {"ASTRAEUS_RUNTIME": "process"}
