from __future__ import annotations

from pathlib import Path

import pytest

# Slices of the Alibaba GPU trace, kept in the repository with their attribution and licence (data/README.md).
TRACE_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture
def write_csv(tmp_path: Path):
    """write_csv("tasks.csv", "header", "row", ...) -> path."""

    def write(name: str, *lines: str) -> Path:
        p = tmp_path / name
        p.write_text("\n".join(lines) + "\n")
        return p

    return write


@pytest.fixture
def trace_dir() -> Path:
    return TRACE_DIR
