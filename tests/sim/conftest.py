from __future__ import annotations

from pathlib import Path

import pytest

# shared/ lies beside the checkout (on developers' machines and in CI alike).
TRACE_DIR = Path(__file__).resolve().parents[3] / "shared" / "traces" / "alibaba-gpu-v2023"


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
    if not (TRACE_DIR / "openb_pod_list_default.csv").exists():
        pytest.fail(f"the Alibaba trace is not at {TRACE_DIR}: shared/ must lie beside the checkout")
    return TRACE_DIR
