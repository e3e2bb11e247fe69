"""`make demo`: the recipe "Preemptible fine-tuning with checkpoints", told step by step on a local cluster.

It starts `astraeus up` (one machine gpu-01 with 8 simulated GPUs, /data/astraeus granted), then runs the
page's own shell lines — curl, jq, astra — against it and prints what each shows. The fine-tune runs in its
offline mode (synthetic CIFAR-shaped data, a small CNN, on the CPU) because this machine reaches no
internet; on a GPU machine with internet the same files run the real ResNet-50 on CIFAR-100.
It says which runtime the cluster's machine uses, as `astraeus up` and its agent report it: on a machine
without NVIDIA GPUs (or without runc, skopeo and umoci) `auto` picks the process runtime, where the run's image
only names the local environment it maps to; ASTRAEUS_RUNTIME=container asks for containers.
Each demo keeps everything in a folder of its own (/tmp/astraeus-demo-*: its cluster's home, the recipe's files
and the checkpoint drive's folder, granted to its workspace instead of /data/astraeus), so two demos at once do not
touch each other's checkpoints; it removes that folder and leaves nothing running when it ends or is interrupted.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from astraeus import envvars

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune"
BIN = Path(sys.executable).parent

BOLD, DIM, GREEN, RESET = "\033[1m", "\033[2m", "\033[32m", "\033[0m"
if not sys.stdout.isatty():
    BOLD = DIM = GREEN = RESET = ""

# Offline mode for this machine, and a pace a 2-core CPU keeps: a checkpoint line every 20 steps.
OFFLINE_ENV = {"ASTRAEUS_OFFLINE": "1", "SAVE_EVERY": "20", "BATCH_SIZE": "32", "OFFLINE_SAMPLES": "2048",
               "STEP_SLEEP": "0.05", "EPOCHS": "3"}
URGENT_SECONDS = int(envvars.get("DEMO_URGENT_SECONDS") or "20")  # shorter than the page's urgent eval


def step(n: int | str, text: str) -> None:
    print(f"\n{BOLD}{n}. {text}{RESET}", flush=True)


def say(text: str) -> None:
    print(f"{DIM}{text}{RESET}", flush=True)


class Shell:
    def __init__(self, cwd: Path, env: dict):
        self.cwd, self.env = cwd, env

    def __call__(self, line: str, show: bool = True, check: bool = True) -> str:
        if show:
            print(f"{GREEN}${RESET} {line}", flush=True)
        p = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=self.cwd, env=self.env, text=True,
                           capture_output=True)
        out = p.stdout
        if show and out:
            print(out, end="" if out.endswith("\n") else "\n", flush=True)
        if check and p.returncode != 0:
            raise SystemExit(f"demo: the command failed ({p.returncode}): {line}\n{p.stderr}")
        return out


def free_port(preferred: int = 8420) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(interval)
    raise SystemExit(f"demo: timed out after {timeout:.0f}s waiting for {what}")


def runtime_said(up_log: str, agent_log: str) -> str:
    """What to print about the runtime, from `astraeus up`'s ready line ("… ready (runtime: process); …") and
    the agent's "runtime: process (auto: no NVIDIA GPU found)" line (pure)."""
    used = re.search(r"ready \(runtime: ([^)]*\)?)\)", up_log)
    why = re.search(r"runtime: \S+(?: \([^)]*\))? \((.*)\)\s*$", agent_log, re.M)
    name = used.group(1) if used else "unknown (astraeus up did not say)"
    line = f"runtime: {name}" + (f" [{why.group(1)}]" if why else "")
    if name.startswith("process"):
        return (line + "\n  the runs' image (pytorch/pytorch) is not pulled: each worker runs in this machine's own Python\n"
                "  environment, which the image maps to; a machine with NVIDIA GPUs and runc, skopeo and umoci\n"
                "  starts each run from its image (README.md, \"Two runtimes\")")
    if name.startswith("container"):
        return (line + "\n  each worker starts from its image, pulled from its registry into the machine's cache: "
                "the first\n  start of pytorch/pytorch waits for a pull of several GiB")
    return line


def demo_folder(demo_home: Path | None) -> tuple[Path, bool]:
    """The demo's folder and whether the demo made it (and so removes it at the end): DEMO_HOME when set (kept),
    else a new /tmp/astraeus-demo-* of this demo's own."""
    if demo_home:
        return Path(demo_home), False
    return Path(tempfile.mkdtemp(prefix="astraeus-demo-")), True


def remove_folder(home: Path) -> None:
    """Remove a demo's folder: its cluster's state and the drive's files (the workspace's user owns some)."""
    shutil.rmtree(home, ignore_errors=True)
    if home.exists():
        say(f"demo: could not remove all of {home}")


def main() -> int:
    from astraeus.settings import DemoSettings, SettingsError

    try:
        demo_home = DemoSettings.load().demo_home
    except SettingsError as e:
        raise SystemExit(f"demo: {e}") from None
    up = None
    home, made = None, False

    def cleanup(*_):
        # A second Ctrl-C while the cluster stops must not leave it half-stopped.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if up and up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        if made:
            remove_folder(home)

    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # also when started in the background, where SIGINT is ignored
    try:
        home, made = demo_folder(demo_home)
        work, data = home / "recipe", home / "data"
        work.mkdir(parents=True, exist_ok=True)
        data.mkdir(parents=True, exist_ok=True)
        drive_dir = data / "ft-ckpt"
        for f in ("drive.json", "finetune.json", "urgent.json", "finetune.py"):
            shutil.copy(EXAMPLE / f, work / f)
        port = free_port()
        step(0, f"Start a local cluster: one machine gpu-01 with 8 simulated GPUs, {data} granted")
        say(f"$ astraeus up --home {home} --port {port} --host-path {data}")
        log = open(home / "up.log", "wb")
        up = subprocess.Popen([str(BIN / "astraeus"), "up", "--home", str(home), "--port", str(port),
                               "--host-path", str(data)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        envfile = home / "env"
        wait_until(lambda: envfile.exists() or up.poll() is not None, 90, "the local cluster")
        if up.poll() is not None:
            raise SystemExit(f"demo: astraeus up exited:\n{(home / 'up.log').read_text()[-2000:]}")
        print(envfile.read_text().split("export ASTRAEUS_ADMIN")[0], end="")
        wait_until(lambda: "ready (runtime:" in (home / "up.log").read_text() or up.poll() is not None, 60,
                   "the machine to be ready")
        agent_log = home / "agent-gpu-01.log"
        print(runtime_said((home / "up.log").read_text(), agent_log.read_text() if agent_log.exists() else ""))
        env = envvars.copy()
        for line in envfile.read_text().splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            env[k] = v
        env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
        env["ASTRAEUS_CONFIG"] = str(home / "cli-config.json")
        sh = Shell(work, env)

        step(1, "Create the checkpoint drive")
        say(f"(its folder is this demo's own, {drive_dir}, instead of the page's /data/astraeus/ft-ckpt: two demos at "
            "once keep their checkpoints apart)")
        sh(f"jq '.spec.sources[0].path = \"{drive_dir}\"' drive.json > drive.demo.json && mv drive.demo.json drive.json")
        sh('curl -fsS -X POST "$API/drives" -H "Authorization: Bearer $ASTRAEUS_TOKEN" \\\n'
           "    -H 'content-type: application/json' -d @drive.json | jq -r .metadata.name")

        step(2, "The script checkpoints on SIGTERM (examples/finetune/finetune.py)")
        say("This machine reaches no internet: the fine-tune runs in its offline mode "
            f"({', '.join(f'{k}={v}' for k, v in OFFLINE_ENV.items())}).")
        sh(f"jq '.spec.task_template.env += {json.dumps(OFFLINE_ENV)}' finetune.json > finetune.offline.json",
           show=False)

        step(3, "Submit the fine-tune at low priority (-100)")
        sh("jq --rawfile src finetune.py \\\n"
           "    '.spec.task_template.configs = [{\"mounts\": [\"/app/finetune.py\"], \"value\": $src}]' \\\n"
           "    finetune.offline.json > finetune.full.json")
        sh('curl -fsS -X POST "$API/runs" -H "Authorization: Bearer $ASTRAEUS_TOKEN" \\\n'
           "    -H 'content-type: application/json' -d @finetune.full.json | jq -r .metadata.name")
        say("The run starts, and the log shows a line every SAVE_EVERY steps:")
        wait_until(lambda: sh("astra astraeus logs finetune-r50-0", show=False, check=False).count("global_step")
                   >= 2, 240, "two checkpoint lines")
        sh("astra astraeus logs finetune-r50-0 | tail -n 2")

        step(4, "Preempt it: an 8-GPU run at the default priority (0)")
        say(f"(urgent-eval sleeps {URGENT_SECONDS} s here instead of 300 s, so the demo stays short)")
        sh("astra astraeus run --name urgent-eval --image pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime \\\n"
           "    --gpus 8 --machines 1 --cpus 4 --mem 16G --time 20m \\\n"
           f"    -- python -c \"import torch,time;print(torch.cuda.device_count(),'GPUs');time.sleep({URGENT_SECONDS})\"")
        say("Within a few seconds the fine-tune is stopped, saves, and waits:")
        wait_until(lambda: "written in" in sh("astra astraeus logs finetune-r50-0", show=False, check=False), 120,
                   "the checkpoint written on SIGTERM")
        out = sh("astra astraeus logs finetune-r50-0 | tail -n 3")
        saved = re.search(r"checkpoint at global step (\d+) written in", out)
        wait_until(lambda: "waiting to run again" in sh("astra astraeus runs", show=False, check=False), 60,
                   "the preempted reason")
        sh("astra astraeus runs")

        step(5, "Watch it resume")
        say("When urgent-eval ends, the GPU is free again and the fine-tune is placed; it finds the checkpoint "
            "on the drive:")
        wait_until(lambda: "resuming at" in sh("astra astraeus logs finetune-r50-0", show=False, check=False),
                   URGENT_SECONDS + 180, "the fine-tune to resume")
        wait_until(lambda: sh("astra astraeus logs finetune-r50-0", show=False, check=False)
                   .split("resuming at", 1)[1].count("global_step") >= 1, 240, "a checkpoint line after resuming")
        out = sh("astra astraeus logs finetune-r50-0 | grep -A1 'resuming at'")
        resumed = re.search(r"\(global step (\d+)\)", out)
        worker = json.loads(sh('curl -fsS "$API/workers/finetune-r50-0" -H "Authorization: Bearer $ASTRAEUS_TOKEN"',
                               show=False))
        if saved and resumed:
            same = saved.group(1) == resumed.group(1)
            print(f"global step at SIGTERM: {saved.group(1)}; resumed at global step {resumed.group(1)}: "
                  f"{'continues' if same else 'DOES NOT continue'}")
        print(f"finetune-r50-0: restarts {worker['restarts']}, preemptions {worker['preemptions']} "
              "(a preemption is not a failure)")

        step(6, "Clean up")
        sh("astra astraeus delete finetune-r50")
        sh("astra astraeus delete urgent-eval", check=False)
        sh('curl -fsS -X DELETE "$API/drives/ft-ckpt" -H "Authorization: Bearer $ASTRAEUS_TOKEN"', show=False)
        print('$ curl -fsS -X DELETE "$API/drives/ft-ckpt" -H "Authorization: Bearer $ASTRAEUS_TOKEN"')
        kept = sorted(p.name for p in drive_dir.glob("*"))
        say(f"Deleting the drive leaves {drive_dir} on gpu-01 as it is: {kept}")
        print(f"\n{BOLD}Done.{RESET} The local cluster stops now; "
              + (f"then the demo removes its folder {home}." if made else f"its state is in {home}."))
        return 0
    except KeyboardInterrupt:
        print("\ndemo: interrupted; stopping the local cluster", flush=True)
        return 130
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
