"""Every example in examples/ followed as a user would: each ```sh block of its README.md run as written, in order,
in a copy of the example's folder (as if `cd examples/<name>`), and after each block the state the README says
the user then sees (a run Completed, a log line, a preemption and the resume from its checkpoint).

A line `astraeus up … &` starts the README's local cluster: the test starts it with the same arguments (plus a
free --port, and the process runtime, as every local-cluster test does), with HOME a folder of the test's own, so
`. ~/.astraeus/env` reads that cluster's. The cluster runs in a mount namespace of its own where /data/astraeus
and each --shared-fs folder are an empty tmpfs: what the README makes there is fresh, and other tests that use the
same host folders (tests/e2e's recipe and ft-lowprio) are not touched. The shell keeps what a block sourced for the
next ones, as a terminal would.

STORIES holds, for each example, one step per block: an example with no story, or whose README's blocks do not
match its story, fails."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tests.conftest import free_port, read_env, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "examples"
EXAMPLES = sorted(p.name for p in EXAMPLES_DIR.iterdir() if p.is_dir())
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.timeout(900)


def blocks(name: str) -> list[str]:
    """The ```sh blocks of examples/<name>/README.md, in order."""
    return re.findall(r"^```sh\n(.*?)^```$", (EXAMPLES_DIR / name / "README.md").read_text(), re.M | re.S)


class Follow:
    """A user at a shell in a copy of the example's folder, with the README's local cluster."""

    def __init__(self, name: str, tmp_path: Path):
        self.cwd = tmp_path / name
        shutil.copytree(EXAMPLES_DIR / name, self.cwd)
        self.home = tmp_path / "user"
        self.home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ASTRAEUS_", "SLURM_", "CKPT_"))}
        env.update(HOME=str(self.home), PATH=f"{VENV_BIN}:{env.get('PATH', '')}")
        self.env = env
        self.sourced: list[str] = []  # what the user's shell sourced so far (`. ~/.astraeus/env`)
        self.up: subprocess.Popen | None = None
        self.vars: dict[str, str] = {}

    # ------------------------------------------------------------------------------------------ the shell
    def sh(self, script: str, timeout: float = 300) -> str:
        full = "set -e -o pipefail\n" + "".join(f"{s}\n" for s in self.sourced) + script
        p = subprocess.run(["bash", "-c", full], cwd=self.cwd, env=self.env, text=True, capture_output=True,
                           timeout=timeout)
        assert p.returncode == 0, f"exit {p.returncode}:\n{script}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
        return p.stdout

    def block(self, text: str) -> str:
        """Run one README block: its `astraeus up … &` line starts the cluster, the rest runs in the shell."""
        out, pending = "", []
        for line in text.splitlines():
            special = line.startswith(("astraeus up", ".venv/bin/astraeus up", ". ", "source "))
            words = shlex.split(line, comments=True) if special else []
            if words[:2] == ["astraeus", "up"] or words[:2] == [".venv/bin/astraeus", "up"]:
                if pending:
                    out += self.sh("\n".join(pending))
                    pending = []
                assert words[-1] == "&" or line.split("#")[0].rstrip().endswith("&"), line
                self.start_cluster([w for w in words[2:] if w != "&"])
            else:
                pending.append(line)
                if words[:1] in (["."], ["source"]):
                    self.sourced.append(line.split("#")[0].strip())
        if pending:
            out += self.sh("\n".join(pending))
        return out

    # ------------------------------------------------------------------------------------- the cluster
    def start_cluster(self, args: list[str]) -> None:
        if "--port" not in args:
            args = [*args, "--port", str(free_port())]
        private = ["/data/astraeus"] + [a.split("=", 1)[1] for i, a in enumerate(args)
                                        if i and args[i - 1] == "--shared-fs"]
        for d in private:
            Path(d).mkdir(parents=True, exist_ok=True)
        mounts = " && ".join(f"mount -t tmpfs -o mode=755 astraeus-example {shlex.quote(d)}" for d in private)
        env = dict(self.env, ASTRAEUS_RUNTIME="process")  # as every local-cluster test: images map to this venv
        self.up_log = open(self.home / "up.log", "wb")
        self.up = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", f'{mounts} && exec "$@"', "sh",
             str(VENV_BIN / "astraeus"), "up", *args],
            cwd=self.cwd, env=env, stdout=self.up_log, stderr=subprocess.STDOUT, start_new_session=True)
        envfile = self.home / ".astraeus" / "env"

        def ready():
            assert self.up.poll() is None, f"astraeus up exited:\n{self.log()}"
            return envfile.exists() and "API" in read_env(envfile) and "ready (runtime:" in self.log()

        wait_for(ready, 120, 0.2, "the local cluster")
        self.vars = read_env(envfile)

    def log(self) -> str:
        return (self.home / "up.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.up and self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.up.kill()
                self.up.wait()

    # ------------------------------------------------------------------------- what the user then sees
    def get(self, path: str):
        with httpx.Client(base_url=self.vars["API"], timeout=30,
                          headers={"Authorization": f"Bearer {self.vars['ASTRAEUS_TOKEN']}"}) as c:
            r = c.get(path)
            return r.text if path.endswith("/logs") else r.json()

    def logs(self, worker: str) -> str:
        return self.get(f"/workers/{worker}/logs")

    def run(self, name: str) -> dict:
        return self.get(f"/runs/{name}")

    def wait_log(self, worker: str, pattern: str, timeout: float = 180, after: str | None = None) -> re.Match:
        def found():
            text = self.logs(worker)
            if after is not None:
                if after not in text:
                    return None
                text = text.split(after, 1)[1]
            return re.search(pattern, text, re.M)

        return wait_for(found, timeout, 0.5, f"{pattern!r} in {worker}'s log")

    def wait_state(self, run: str, state: str, timeout: float = 180) -> dict:
        def reached():
            r = self.run(run)
            got = r.get("status", {}).get("state")
            assert got not in {"Failed", "Cancelled"} - {state}, f"{run} {got}: {json.dumps(r.get('status'))[:2000]}"
            return got == state and r

        return wait_for(reached, timeout, 0.5, f"{run} {state}")


# ------------------------------------------------------------------------------------------ the stories
# One function per README block: it gets the block's output, checks it, and waits for what the README says comes
# next. `memo` carries figures from one step to a later one (the step a preempted run saved at).

def submitted(name):
    return lambda f, out, memo: assert_equal(out, f"{name}\n")


def assert_equal(got, want):
    assert got == want, f"got {got!r}, want {want!r}"


def cluster_up(f, out, memo):
    assert f.up is not None and f.vars["API"], "the block starts no cluster"


def preempted_and_resumed(run, worker, saved_re, resumed_re, urgent):
    def step(f, out, memo):
        assert out.startswith(f"{urgent} submitted to main: "), out
        memo["saved"] = int(f.wait_log(worker, saved_re, 120)[1])
        r = f.wait_state(run, "Pending", 60)
        assert r["status"]["reason"] == f"Preempted by higher-priority work ({urgent}); waiting to run again", r
        memo["resumed"] = int(f.wait_log(worker, resumed_re, 240)[1])
        w = f.get(f"/workers/{worker}")
        assert w["restarts"] == 0 and w["preemptions"] == 1, w
    return step


def ft_lowprio_code_on_the_drive(f, out, memo):
    assert_equal(out, "checkpoints\ncopy-code\n")
    f.wait_state("copy-code", "Completed", 120)
    assert "copied train.py to /ckpt/code/train.py" in f.logs("copy-code-0")


def ft_lowprio_training(f, out, memo):
    assert_equal(out, "ft-lowprio\n")
    f.wait_log("ft-lowprio-0", r'^\{"step": 20, "loss": ', 240)


def ft_lowprio_log(f, out, memo):
    n = memo["saved"]
    assert memo["resumed"] == n + 1  # the page's train.py: start = state["step"] + 1
    assert_equal(out, f"SIGTERM: checkpoint at step {n} written; exiting\nresuming at step {n + 1}\n"
                      "ft-lowprio deleted\n")


def ft_lowprio_sbatch(f, out, memo):
    assert_equal(out, "template ft created (version 1)\nSubmitted batch job finetune\n")
    run = f.run("finetune")
    assert run["spec"]["priority"] == -100 and run["spec"]["template"] == "ft"
    assert [d["name"] for d in run["spec"]["task_template"]["datavolume_refs"]] == ["checkpoints"]
    f.wait_log("finetune-0", r'^\{"step": 20, "loss": ', 240)


def finetune_alone(f, out, memo):
    lines = out.splitlines()
    assert lines[-1] == "done", out
    assert [json.loads(ln)["global_step"] for ln in lines[:-1]] == [4, 8, 12, 16], out


def finetune_training(f, out, memo):
    assert_equal(out, "ft-ckpt\nfinetune-r50\n")
    f.wait_log("finetune-r50-0", r'"global_step": 40,', 240)


def finetune_preempted(f, out, memo):
    lines = out.splitlines()
    assert [json.loads(ln)["global_step"] % 20 for ln in lines[:2]] == [0, 0], out
    preempted_and_resumed("finetune-r50", "finetune-r50-0",
                          r"^checkpoint at global step (\d+) written in \d+\.\ds; exiting$",
                          r"^resuming at epoch \d+, step \d+ \(global step (\d+)\)$", "urgent-eval")(
        f, "\n".join(lines[2:]), memo)
    assert memo["resumed"] == memo["saved"]  # the global step continues
    f.wait_log("finetune-r50-0", r'"global_step": ', 120, after="resuming at")


def finetune_cleaned_up(f, out, memo):
    lines = out.splitlines()
    assert re.fullmatch(rf"resuming at epoch \d+, step \d+ \(global step {memo['saved']}\)", lines[0]), out
    assert json.loads(lines[1])["global_step"] > memo["saved"]
    assert lines[2:4] == ["finetune-r50 deleted", "urgent-eval deleted"], out
    assert json.loads(lines[4]) == {"name": "ft-ckpt", "deleted": True}, out  # the drive's DELETE


def gang_allreduce(f, out, memo):
    assert_equal(out, "allreduce\n")
    f.wait_state("allreduce", "Completed", 180)


def gang_training(f, out, memo):
    ranks = re.findall(r"^rank (\d) of 2 on \S+: all_reduce sum = 3$", out, re.M)
    assert sorted(ranks) == ["0", "1"], out
    assert out.endswith("lab-ckpt\ngang-ft\n"), out
    f.wait_log("gang-ft-0", r"^checkpoint at step 50$", 240)


def gang_log(f, out, memo):
    n = memo["saved"]
    assert memo["resumed"] == n
    assert_equal(out, f"SIGTERM: checkpoint at step {n} written; exiting\nresuming at step {n}\ngang-ft deleted\n")


def gpu_health_read(f, out, memo):
    """Real NVML on a GPU machine (exit 0, or 1 naming the failed GPU first); here, without one, it says so."""
    lines = out.splitlines()
    code = lines[-1]
    if code == "exit 2":
        assert len(lines) == 2 and lines[0].startswith("no NVML here: "), out
        return
    assert code in ("exit 0", "exit 1"), out
    assert re.fullmatch(r"\d+ GPU\(s\), \d+ with a fatal fault; XIDs watched for 2s \(.*\)", lines[-2]), out
    assert all(re.match(r"GPU \d+ ", ln) for ln in lines[:-2]), out


def gpu_sharing_proof(f, out, memo):
    """Issue 46: on an NVIDIA machine with MPS it proves the limits (exit 0); here, without MPS, it says so."""
    lines = out.splitlines()
    if lines[-1] == "exit 2":
        assert lines[0].startswith("nvidia-cuda-mps-control not found"), out
        return
    assert lines[-1] == "exit 0" and lines[-2].startswith("PROVEN: "), out


STORIES = {
    "gpu_health": [gpu_health_read],
    "gpu_sharing": [gpu_sharing_proof],
    "finetune": [finetune_alone, cluster_up, finetune_training, finetune_preempted, finetune_cleaned_up],
    "ft-lowprio": [cluster_up, ft_lowprio_code_on_the_drive, ft_lowprio_training,
                   preempted_and_resumed("ft-lowprio", "ft-lowprio-0", r"^SIGTERM: checkpoint at step (\d+) written",
                                         r"^resuming at step (\d+)$", "urgent"),
                   ft_lowprio_log, ft_lowprio_sbatch],
    "gang": [cluster_up, gang_allreduce, gang_training,
             preempted_and_resumed("gang-ft", "gang-ft-0", r"^SIGTERM: checkpoint at step (\d+) written",
                                   r"^resuming at step (\d+)$", "urgent"),
             gang_log],
}


def test_every_example_has_a_story_for_each_block_of_its_readme():
    missing = [n for n in EXAMPLES if n not in STORIES]
    assert not missing, f"examples with no test: {missing} (add each one's story to STORIES)"
    assert not set(STORIES) - set(EXAMPLES), "a story for an example that is gone"
    for name in EXAMPLES:
        assert len(blocks(name)) == len(STORIES[name]), \
            f"examples/{name}/README.md has {len(blocks(name))} sh blocks, its story {len(STORIES[name])} steps"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_readme_as_written(name, tmp_path):
    if name not in STORIES:
        pytest.fail(f"examples/{name} has no test: add its story to STORIES")
    texts = blocks(name)
    if any("--netns" in t for t in texts):
        from astraeus.fleet import netns

        if why := netns.unavailable():
            pytest.skip(f"--netns: {why}")
    f = Follow(name, tmp_path)
    memo: dict = {}
    try:
        for i, (text, story) in enumerate(zip(texts, STORIES[name], strict=True)):
            out = f.block(text)
            try:
                story(f, out, memo)
            except AssertionError as e:
                raise AssertionError(f"examples/{name}/README.md, block {i + 1}:\n{text}\n{e}") from None
    except BaseException:
        if f.up:
            print(f.log()[-4000:])
        raise
    finally:
        f.stop()
