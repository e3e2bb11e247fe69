"""`make demo` (python -m astraeus.demo): each demo keeps its cluster, recipe and checkpoint drive in a folder of its
own, so two demos at once never share a checkpoint, and removes that folder when it ends, normally or on Ctrl-C.

Two demos run at once here: the first to its end (exit 0), the second interrupted (SIGINT, as Ctrl-C) once its
drive exists. Both folders are gone afterwards and no process of either is left."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from astraeus import demo

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]


class Demo:
    """`python -m astraeus.demo` as a child process, its output read line by line."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
        env.update(PYTHONUNBUFFERED="1", DEMO_URGENT_SECONDS="3")
        self.p = subprocess.Popen([sys.executable, "-m", "astraeus.demo"], cwd=ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
        self.lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"the demo exited ({self.p.wait()}) before {pattern!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no {pattern!r} in {timeout}s:\n" + "\n".join(self.lines))

    def wait(self, timeout: float) -> int:
        rc = self.p.wait(timeout=timeout)
        while (line := self._q.get(timeout=10)) is not None:
            self.lines.append(line)
        return rc

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def processes_naming(folder: Path) -> list[str]:
    """Command lines of the processes that name `folder` (a demo's cluster: astraeus up, its agent, workers)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in text:
            found.append(text)
    return found


def test_demo_folder_is_new_for_each_demo_unless_the_home_is_given(tmp_path):
    a, made_a = demo.demo_folder(None)
    b, made_b = demo.demo_folder(None)
    try:
        assert a != b and made_a and made_b
        assert a.name.startswith("astraeus-demo-") and b.name.startswith("astraeus-demo-")
    finally:
        demo.remove_folder(a)
        demo.remove_folder(b)
    assert not a.exists() and not b.exists()
    assert demo.demo_folder(tmp_path) == (tmp_path, False)  # DEMO_HOME given: the user's folder, kept


def test_two_demos_at_once_keep_apart_and_leave_no_folder_when_done_or_interrupted():
    first = Demo()
    second = None
    try:
        home1 = Path(first.expect(r"^\$ astraeus up --home (\S+) ", 120)[1])
        drive1 = first.expect(r"^\$ jq '\.spec\.sources\[0\]\.path = \"([^\"]+)\"' drive\.json", 120)[1]
        first.expect(r"^ft-ckpt$", 60)  # its drive exists: its cluster took its port
        second = Demo()
        home2 = Path(second.expect(r"^\$ astraeus up --home (\S+) ", 120)[1])
        drive2 = second.expect(r"^\$ jq '\.spec\.sources\[0\]\.path = \"([^\"]+)\"' drive\.json", 120)[1]
        second.expect(r"^ft-ckpt$", 60)
        assert home1 != home2 and home1.name.startswith("astraeus-demo-") and home2.name.startswith("astraeus-demo-")
        assert drive1 != drive2
        assert Path(drive1).is_relative_to(home1) and Path(drive2).is_relative_to(home2)

        second.p.send_signal(signal.SIGINT)  # Ctrl-C
        assert second.wait(150) == 130, "\n".join(second.lines)
        assert "demo: interrupted; stopping the local cluster" in second.lines
        assert not home2.exists()
        assert not processes_naming(home2)

        first.expect(r"^Done\.", 420)  # the first demo went on beside it, to its end
        assert first.wait(150) == 0, "\n".join(first.lines)
        text = "\n".join(first.lines)
        assert "continues" in text and "restarts 0, preemptions 1" in text, text
        assert not home1.exists()
        assert not processes_naming(home1)
    finally:
        first.kill()
        if second:
            second.kill()
