"""A small filesystem of its own for a test (a loop-mounted ext4), to fill until ENOSPC."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def unavailable() -> str | None:
    """Why a loop filesystem cannot be made here, or None."""
    if os.geteuid() != 0:
        return "mounting a loop filesystem needs root"
    for tool in ("truncate", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control)"
    return None


@contextlib.contextmanager
def small_fs(where: Path, mib: int = 64):
    """A fresh ext4 of `mib` MiB mounted at `where` (made); unmounted (lazily) and its image removed at the end.
    Skips the test with the reason where it cannot be made."""
    why = unavailable()
    if why:
        pytest.skip(f"a small filesystem to fill: {why}")
    where.mkdir(parents=True, exist_ok=True)
    image = where.parent / f"{where.name}.img"
    subprocess.run(["truncate", "-s", f"{mib}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True)
    p = subprocess.run(["mount", "-o", "loop", str(image), str(where)], capture_output=True, text=True)
    if p.returncode != 0:
        image.unlink(missing_ok=True)
        pytest.skip(f"a small filesystem to fill: mount -o loop failed ({p.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        image.unlink(missing_ok=True)


def fill(path: Path, leave: int = 0) -> int:
    """Write `path` until the filesystem has no room (ENOSPC), or only about `leave` bytes are left; the bytes
    written."""
    n = 0
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                st = os.statvfs(path)
                free = st.f_bfree * st.f_frsize
                if leave and free - len(chunk) < leave:
                    if free > leave:
                        f.write(b"\0" * (free - leave))
                        f.flush()
                        os.fsync(f.fileno())
                    break
                f.write(chunk)
                f.flush()
                n += len(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            os.fsync(f.fileno())
    return n
