"""The example scripts themselves, run as processes: examples/finetune/finetune.py in its offline mode
(ASTRAEUS_OFFLINE=1: synthetic data, small CNN, CPU) and examples/ft-lowprio/train.py.

They print periodic lines; SIGTERM makes them save a checkpoint and exit 0; a rerun resumes from it
at the same global step; a SIGKILL in the middle of a save leaves the previous checkpoint loadable.
"""
import json
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

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
FINETUNE = ROOT / "examples" / "finetune" / "finetune.py"
TRAIN = ROOT / "examples" / "ft-lowprio" / "train.py"

pytestmark = pytest.mark.timeout(180)

CKPT_LINE = re.compile(r"^checkpoint at global step (\d+) written in (\d+\.\d)s; exiting$")
RESUME_LINE = re.compile(r"^resuming at epoch (\d+), step (\d+) \(global step (\d+)\)$")

# 512 samples / batch 16 = 32 steps an epoch
SAMPLES, BATCH, EPOCHS = 512, 16, 2
STEPS_PER_EPOCH = SAMPLES // BATCH


class Proc:
    """A script run as a child process, its output lines read by a thread."""

    def __init__(self, script, env):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ASTRAEUS_", "SLURM_", "CKPT_"))}
        full_env.update(env)
        full_env["PYTHONUNBUFFERED"] = "1"
        self.p = subprocess.Popen([sys.executable, str(script)], env=full_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines = []
        self._q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, pattern, timeout=60):
        """The first line from now on that matches pattern (a regex), as a match."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} in {timeout}s; output:\n" + "\n".join(self.lines))
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"exited ({self.p.wait()}) before a line matching {pattern!r}; output:\n"
                                     + "\n".join(self.lines))
            self.lines.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def wait(self, timeout=60):
        rc = self.p.wait(timeout=timeout)
        while (line := self._q.get(timeout=5)) is not None:
            self.lines.append(line)
        return rc

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def procs():
    started = []
    yield lambda script, env: started.append(Proc(script, env)) or started[-1]
    for pr in started:
        pr.kill()


def finetune_env(tmp_path, **extra):
    env = {"ASTRAEUS_OFFLINE": "1", "CKPT_DIR": str(tmp_path), "ASTRAEUS_JOB_NAME": "ws-test.finetune-r50",
           "OFFLINE_SAMPLES": str(SAMPLES), "BATCH_SIZE": str(BATCH), "EPOCHS": str(EPOCHS), "SAVE_EVERY": "8",
           "STEP_SLEEP": "0.01"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def periodic(m_line):
    return json.loads(m_line.group(0))


PERIODIC = r'^\{"epoch": \d+, "global_step": \d+, "loss": [0-9.]+\}$'


def test_finetune_sigterm_checkpoints_and_resumes_at_the_same_global_step(tmp_path, procs):
    ckpt = tmp_path / "b" / "finetune-r50" / "ckpt.pt"
    # An uninterrupted run alongside, to compare the final weights with.
    straight = procs(FINETUNE, finetune_env(tmp_path / "a", STEP_SLEEP=0))
    first = procs(FINETUNE, finetune_env(tmp_path / "b"))
    line = periodic(first.expect(PERIODIC))
    assert line["epoch"] == 1 and line["global_step"] == 8
    first.p.send_signal(signal.SIGTERM)
    first.expect(r"^SIGTERM: saving a checkpoint after this step$")
    n = int(first.expect(CKPT_LINE.pattern).group(1))
    assert first.wait() == 0
    assert 8 <= n < STEPS_PER_EPOCH * EPOCHS
    ck = torch.load(ckpt, map_location="cpu")
    assert ck["global_step"] == n
    assert ck["epoch"] * STEPS_PER_EPOCH + ck["step"] == n

    second = procs(FINETUNE, finetune_env(tmp_path / "b", STEP_SLEEP=0))
    m = second.expect(RESUME_LINE.pattern)
    epoch, step, global_step = (int(g) for g in m.groups())
    assert global_step == n
    assert (epoch - 1) * STEPS_PER_EPOCH + step == n
    nxt = periodic(second.expect(PERIODIC))
    assert nxt["global_step"] == (n // 8 + 1) * 8  # the count goes on from where it stopped
    for pr in (second, straight):
        pr.expect(r"^done$")
        assert pr.wait() == 0
    assert torch.load(ckpt, map_location="cpu")["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert not any("Traceback" in ln for ln in first.lines + second.lines)
    # Resuming skips exactly the batches already seen and restores model, optimiser and schedule, so
    # (on one CPU thread) stopping and resuming changes nothing in the final weights.
    wa = torch.load(tmp_path / "a" / "finetune-r50" / "model.pt")
    wb = torch.load(tmp_path / "b" / "finetune-r50" / "model.pt")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_finetune_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, procs):
    # SAVE_EVERY=1: the script is saving most of the time. Kill it (SIGKILL, no chance to clean up) the
    # moment the temporary file appears, three times or more: ckpt.pt must always load, and never go back.
    ckpt = tmp_path / "finetune-r50" / "ckpt.pt"
    tmp = Path(str(ckpt) + ".tmp")
    last, mid_save = 0, 0
    for attempt in range(6):  # three rounds, more if none has yet landed in the middle of a save
        pr = procs(FINETUNE, finetune_env(tmp_path, SAVE_EVERY=1, STEP_SLEEP=0, EPOCHS=50))
        pr.expect(PERIODIC)  # running; from here on every step saves
        deadline = time.monotonic() + 20
        while not tmp.exists() and time.monotonic() < deadline:
            time.sleep(0.0005)
        pr.p.send_signal(signal.SIGKILL)
        assert pr.wait() == -signal.SIGKILL
        mid_save += tmp.exists()
        ck = torch.load(ckpt, map_location="cpu")  # whole: a torn write would not unpickle
        assert set(ck) == {"model", "opt", "sched", "epoch", "step", "global_step"}
        assert ck["global_step"] >= last
        assert ck["epoch"] * STEPS_PER_EPOCH + ck["step"] == ck["global_step"]
        last = ck["global_step"]
        if attempt:
            assert any(RESUME_LINE.match(ln) for ln in pr.lines)
        if attempt >= 2 and mid_save:
            break
    assert last > 0
    assert mid_save >= 1, "no kill landed in the middle of a save"


def test_train_py_sigterm_checkpoints_and_resumes(tmp_path, procs):
    env = {"CKPT_ROOT": str(tmp_path), "SLURM_JOB_NAME": "ft-lowprio", "TOTAL_STEPS": "300", "STEP_SLEEP": "0.003",
           "LOG_EVERY": "50"}
    ckpt = tmp_path / "ft-lowprio" / "latest.pt"
    first = procs(TRAIN, env)
    first.expect(r'^\{"step": 100, "loss": ')
    assert ckpt.exists()  # the periodic save at step 0
    first.p.send_signal(signal.SIGTERM)
    stopped = int(first.expect(r"^SIGTERM: checkpoint at step (\d+) written; exiting$").group(1))
    assert first.wait() == 0
    assert stopped < 300
    assert torch.load(ckpt, map_location="cpu")["step"] == stopped
    assert not (tmp_path / "ft-lowprio" / "latest.pt.tmp").exists()

    second = procs(TRAIN, env)
    assert int(second.expect(r"^resuming at step (\d+)$").group(1)) == stopped + 1
    second.expect(r"^done$")
    assert second.wait() == 0
    assert not any("Traceback" in ln for ln in first.lines + second.lines)
