"""Fixtures for container tests: a real local registry and test images pushed to it (see tests/oci.py).

The session's `registry`, `python_layout` and `python_image` are tests/conftest.py's (one registry and one push
per session for the whole suite). Other test folders can use these with
`from tests.containers.conftest import busybox_layout, busybox_image` (pytest finds fixtures imported into a
conftest.py or a test module).
"""

from __future__ import annotations

import pytest

from tests import oci


def _require_tools() -> None:
    missing = oci.tools_missing()
    if missing:
        pytest.skip(f"container image tools not installed: {', '.join(missing)} (make system-deps installs them)")


@pytest.fixture(scope="session")
def busybox_layout(tmp_path_factory) -> str:
    """The busybox test image as an OCI layout reference ("oci:<dir>:busybox")."""
    _require_tools()
    return oci.build_busybox_image(str(tmp_path_factory.mktemp("busybox-layout") / "oci"))


@pytest.fixture(scope="session")
def busybox_image(registry, busybox_layout) -> str:
    """"127.0.0.1:PORT/test/busybox:1" in the `registry` fixture."""
    return oci.push(busybox_layout, registry, "test/busybox:1")


@pytest.fixture
def auth_registry():
    """A docker-registry that wants a user/password: .username, .password, .host."""
    _require_tools()
    reg = oci.Registry(auth=("astraeus-test", "pw-" + __import__("secrets").token_hex(12)))
    try:
        yield reg
    finally:
        reg.stop()
