"""This process's environment variables: read and written here and in astraeus.settings only
(tests/test_no_environ.py checks it).

Configuration is read through astraeus.settings' models. This module is for what must not import pydantic, to
start fast: `astra`, a worker's supervisor (the shim) and the launcher that forks it (they read what the agent
gave them), and the environments handed on to child processes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Defaults that a command must know without loading the settings' models (astraeus.settings declares them with these)
SQUEUE_MIN_JOB_AGE = 300.0  # ASTRAEUS_SQUEUE_MIN_JOB_AGE


def get(name: str, default: str | None = None) -> str | None:
    """One variable's value (`default` when unset)."""
    return os.environ.get(name, default)


def copy(**extra: str) -> dict[str, str]:
    """The whole environment, a copy (for a child process), with `extra` variables set."""
    return {**os.environ, **extra}


def prefixed(prefix: str) -> tuple[tuple[str, str], ...]:
    """The variables whose names start with `prefix` (case-insensitive), sorted: what a cached settings model
    was read from, to notice a change."""
    n, p = len(prefix), prefix.upper()
    return tuple(sorted((k, v) for k, v in os.environ.items() if k[:n].upper() == p))


def replace(env: Mapping[str, str]) -> None:
    """Make `env` this process's whole environment (a shim forked by the launcher takes the one the agent gave
    it, as if it had been started with it)."""
    os.environ.clear()
    os.environ.update(env)
