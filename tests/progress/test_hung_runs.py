"""Hung runs and the least work lost, live (issue 47): a real `astraeus up` with two machines, runs that print
progress and then hang, and a preemption choosing its victim by checkpoints. The progress and checkpoint files are
tried on both runtimes (tests.runtimes: in a container they lie in /run/astraeus/work)."""

import re
import time

import httpx
import pytest

from tests.conftest import start_cluster, wait_for
from tests.runtimes import KINDS, container_skip_reason, runtime_env

STALL = 3  # seconds without progress before a run counts as hung


def _stalled(text: str, step: int, at_start: bool = False) -> bool:
    """`No progress for N s (last: step STEP at …`, N at least the stall (a busy machine notices a second late)."""
    m = (re.match if at_start else re.search)(rf"No progress for (\d+) s \(last: step {step} at ", text or "")
    return m is not None and int(m.group(1)) >= STALL

PRINTS_THEN_HANGS = ("import time\nfor i in range(1, 4):\n    print(f'step {i}', flush=True)\n    time.sleep(0.3)\n"
                     "time.sleep(3600)\n")
TOUCHES_THEN_HANGS = ("import os, time\nopen(os.environ['ASTRAEUS_PROGRESS_FILE'], 'w').write('step 5')\n"
                      "time.sleep(3600)\n")
# rank 0 keeps making progress; rank 1 prints one step and hangs
RANK_1_HANGS = ("import os, time\ni = 0\nwhile True:\n    i += 1\n    print(f'step {i}', flush=True)\n"
                "    if os.environ['ASTRAEUS_WORKER_INDEX'] == '1':\n        time.sleep(3600)\n    time.sleep(0.5)\n")
# writes its checkpoint file every half second
CHECKPOINTS = ("import os, time\nwhile True:\n    open(os.environ['ASTRAEUS_CHECKPOINT_FILE'], 'w').write('saved')\n"
               "    time.sleep(0.5)\n")
SLEEPS = "import time\ntime.sleep(3600)\n"
# prints its steps, goes quiet past its stall time, then makes progress again
HANGS_THEN_GOES_ON = (f"import time\nprint('step 1', flush=True)\ntime.sleep({STALL + 3})\n"
                      "while True:\n    print('step 1240', flush=True)\n    time.sleep(0.5)\n")


def _run(name: str, code: str, *, progress: dict | None = None, gpus: int = 0, machines: int = 1,
         restart: str = "OnFailure", priority: int = 0, on: str | None = None, image: str = "python:3.11") -> dict:
    rr: dict = {"cpu_cores": 0.1, "memory_bytes": 1 << 27, "gpu_requests": {"count": gpus}}
    if machines > 1:
        rr["machines"] = machines
    if on:
        rr["node_selection"] = {"mode": "Names", "names": [on]}
    spec: dict = {"priority": priority, "task_template": {
        "image": image, "command": "python", "args": ["-c", code], "restart_policy": restart,
        "max_restarts": 3, "requested_resources": rr}}
    if progress:
        spec["progress"] = progress
    return {"metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("hung") / "home", machines=2, stop_grace=1.0)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def cl_container(tmp_path_factory, request):
    """The same cluster with container-runtime machines (the session's python image)."""
    if (why := container_skip_reason()) is not None:
        pytest.skip(why)
    containers = request.getfixturevalue("containers")
    c = start_cluster(tmp_path_factory.mktemp("hung-container") / "home", machines=2, stop_grace=1.0,
                      env=runtime_env("container", containers))
    c.image = containers.image
    yield c
    c.stop()


@pytest.fixture(params=KINDS)
def any_cl(request):
    """Each runtime's cluster in turn; `.image` is what its runs name."""
    if request.param == "process":
        c = request.getfixturevalue("cl")
        c.image = "python:3.11"
        return c
    return request.getfixturevalue("cl_container")


def _history(cl, name: str) -> list[str]:
    return [h["reason"] for h in cl.run(name)["status"]["history"]]


def test_a_run_that_prints_progress_then_hangs_is_failed_with_the_reason(cl):
    with cl.client() as c:
        body = _run("hangs-fail", PRINTS_THEN_HANGS, restart="Never",
                    progress={"stall_seconds": STALL, "pattern": r"step (\d+)", "on_stall": "fail"})
        assert c.post("/runs", json=body).status_code == 201
        wait_for(lambda: cl.run("hangs-fail")["status"]["state"] == "Running", timeout=30, what="running")
        wait_for(lambda: "step 3" in cl.logs("hangs-fail-0"), timeout=10, what="its steps")
        caught = time.time()
        wait_for(lambda: cl.run("hangs-fail")["status"]["state"] == "Failed", timeout=STALL + 10, what="failed")
        assert time.time() - caught <= STALL + 10
        reason = cl.run("hangs-fail")["status"]["reason"]
        assert _stalled(reason, 3) and " UTC)" in reason, reason
        events = c.get("/events").json()["items"]
        assert any(e["kind"] == "RunStalled" and e["object"] == "hangs-fail" for e in events), events
        assert cl.run("hangs-fail")["status"]["restarts"] == 0


def test_a_run_that_touches_its_progress_file_then_hangs_is_restarted(any_cl):
    cl = any_cl
    with cl.client() as c:
        body = _run("hangs-restart", TOUCHES_THEN_HANGS, image=cl.image,
                    progress={"stall_seconds": STALL, "on_stall": "restart"})
        assert c.post("/runs", json=body).status_code == 201
        wait_for(lambda: cl.run("hangs-restart")["status"]["state"] == "Running", timeout=30, what="running")
        wait_for(lambda: cl.run("hangs-restart")["status"]["restarts"] >= 1, timeout=STALL + 10, what="restarted")
        history = _history(cl, "hangs-restart")
        assert any(_stalled(h, 5) for h in history), history
        assert cl.run("hangs-restart")["status"]["state"] in ("Pending", "Starting", "Running")
        assert c.delete("/runs/hangs-restart").status_code in (200, 202)


def test_a_gang_names_the_stalled_rank_and_its_machine(cl):
    with cl.client() as c:
        body = _run("gang-hangs", RANK_1_HANGS, machines=2, restart="Never",
                    progress={"stall_seconds": STALL, "pattern": r"step \d+", "on_stall": "fail"})
        assert c.post("/runs", json=body).status_code == 201
        wait_for(lambda: cl.run("gang-hangs")["status"]["state"] == "Running", timeout=30, what="running")
        wait_for(lambda: cl.run("gang-hangs")["status"]["state"] in ("Stopping", "Failed"), timeout=STALL + 12,
                 what="caught")
        machine = cl.worker("gang-hangs-1")["machine"]
        wait_for(lambda: cl.run("gang-hangs")["status"]["state"] == "Failed", timeout=15, what="failed")
        reason = cl.run("gang-hangs")["status"]["reason"]
        assert ": rank 1 (gang-hangs-1) on gpu-0" in reason and "(last: step 1 at " in reason, reason
        assert machine is None or machine in " ".join(_history(cl, "gang-hangs"))


@pytest.mark.parametrize("progress, field", [
    ({"stall_seconds": 0}, "stall_seconds"),
    ({"stall_seconds": 3, "pattern": "step ("}, "pattern"),
    ({"stall_seconds": 3, "on_stall": "kill"}, "on_stall"),
    ({"pattern": "step"}, "stall_seconds"),
])
def test_bad_progress_spec_is_refused_naming_the_field(cl, progress, field):
    with cl.client() as c:
        r = c.post("/runs", json=_run("bad-progress", SLEEPS, progress=progress))
        assert r.status_code == 422, r.text
        assert field in r.text, r.text
        assert c.get("/runs/bad-progress").status_code == 404


def test_least_work_lost_stops_the_victim_with_the_most_recent_checkpoint(any_cl):
    cl = any_cl
    with cl.admin() as adm:
        r = adm.patch("/clusters/main", json={"preemption_victims": "least-work-lost"})
        assert r.status_code == 200 and r.json()["preemption_victims"] == "least-work-lost", r.text
        r = adm.patch("/clusters/main", json={"preemption_victims": "newest"})
        assert r.status_code == 422 and "preemption_victims" in r.text, r.text
    with cl.client() as c:
        # the older run checkpoints all the time; the newer never does: the pages' rule would stop the newer
        assert c.post("/runs", json=_run("ckpt-often", CHECKPOINTS, gpus=4, priority=-100, on="gpu-01",
                                         image=cl.image)).status_code == 201
        wait_for(lambda: cl.run("ckpt-often")["status"]["state"] == "Running", timeout=30, what="ckpt-often")
        time.sleep(1.5)
        assert c.post("/runs", json=_run("no-ckpt", SLEEPS, gpus=4, priority=-100, on="gpu-01", image=cl.image)
                      ).status_code == 201
        wait_for(lambda: cl.run("no-ckpt")["status"]["state"] == "Running", timeout=30, what="no-ckpt")
        time.sleep(2)  # a report carries ckpt-often's checkpoint time
        assert c.post("/runs", json=_run("urgent", SLEEPS, gpus=4, on="gpu-01", restart="Never", image=cl.image)
                      ).status_code == 201
        wait_for(lambda: cl.run("urgent")["status"]["state"] == "Running", timeout=30, what="urgent")
        assert cl.run("ckpt-often")["status"]["preemptions"] == 1
        assert cl.run("no-ckpt")["status"]["preemptions"] == 0
        history = _history(cl, "ckpt-often")
        assert any("loses " in h and "of work since its checkpoint at " in h for h in history), history
        for name in ("urgent", "ckpt-often", "no-ckpt"):
            c.delete(f"/runs/{name}")


def _since_progress(cl, run: str) -> list[str]:
    """The /metrics lines of astraeus_seconds_since_progress for `run`'s workers."""
    text = httpx.get(cl.server + "/metrics", timeout=10).text
    return [ln for ln in text.splitlines()
            if ln.startswith("astraeus_seconds_since_progress{") and re.search(rf'run="{run}"', ln)]


def test_a_notified_stall_clears_when_progress_resumes_and_its_gauge_goes_when_it_ends(cl):
    with cl.client() as c:
        body = _run("hangs-notify", HANGS_THEN_GOES_ON,
                    progress={"stall_seconds": STALL, "pattern": r"step (\d+)", "on_stall": "notify"})
        assert c.post("/runs", json=body).status_code == 201
        wait_for(lambda: _stalled(cl.run("hangs-notify")["status"]["reason"], 1, at_start=True),
                 timeout=30 + STALL, what="the stall as its reason")
        assert cl.run("hangs-notify")["status"]["state"] == "Running"
        assert _since_progress(cl, "hangs-notify"), "a watched running worker has its gauge"
        wait_for(lambda: cl.run("hangs-notify")["status"]["reason"] == "1 of 1 workers running", timeout=15,
                 what="its own reason back")
        history = _history(cl, "hangs-notify")
        assert "Progress again: step 1240" in history, history
        events = c.get("/events").json()["items"]
        assert any(e["kind"] == "RunProgressAgain" and e["object"] == "hangs-notify"
                   and e["message"] == "Progress again: step 1240" for e in events), events
        assert cl.run("hangs-notify")["status"]["restarts"] == 0
        assert c.delete("/runs/hangs-notify").status_code in (200, 202)
        wait_for(lambda: not _since_progress(cl, "hangs-notify"), timeout=10, what="its gauge series removed")
