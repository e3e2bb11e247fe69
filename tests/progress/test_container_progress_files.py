"""A container worker's progress and checkpoint files (issue 47): the worker writes them in /run/astraeus/work, its
own folder (read-write, noexec; the rest of /run/astraeus stays read-only), and the agent reads them from the
attempt's folder as it does for the process runtime (ContainerRuntime, runc, the session's python image)."""

from __future__ import annotations

import pytest

from astraeus.agent.runtime.progress import mark_progress, read_progress
from astraeus.protocol import WorkerReport
from tests.agent.conftest import wait_for
from tests.runtimes import container_skip_reason

SCRIPT = ("echo $ASTRAEUS_PROGRESS_FILE $ASTRAEUS_CHECKPOINT_FILE; echo 'step 7' > $ASTRAEUS_PROGRESS_FILE; "
          "echo saved > $ASTRAEUS_CHECKPOINT_FILE; cp /bin/true /run/astraeus/work/t && "
          "(/run/astraeus/work/t && echo exec-allowed || echo exec-refused); "
          "(echo x > /run/astraeus/stop-reason) 2>/dev/null && echo signal-writable || echo signal-read-only; "
          "echo ready; sleep 60")


@pytest.fixture
def rt(tmp_path, request):
    if (why := container_skip_reason()) is not None:
        pytest.skip(why)
    r = request.getfixturevalue("containers").runtime(str(tmp_path / "state"), stop_grace=1)
    yield r
    for st in r.list():
        if not st.final:
            r.stop(st.worker, st.attempt, grace=0)


def test_a_container_worker_writes_its_progress_and_checkpoint_files_the_agent_reads(rt, containers):
    a = {"worker": "team.progress-0", "attempt": 1, "run": "progress", "desired": "Running", "image": containers.image,
         "command": "sh", "args": ["-c", SCRIPT], "env": {}, "gpu_indices": [], "workspace_number": 7, "mounts": [],
         "configs": []}
    rt.start(a)
    wait_for(lambda: "ready" in [ln.text for ln in rt.logs(a["worker"], 1)], timeout=60)
    out = [ln.text for ln in rt.logs(a["worker"], 1)]
    assert "/run/astraeus/work/.astraeus-progress /run/astraeus/work/.astraeus-checkpoint" in out, out
    assert "exec-refused" in out and "signal-read-only" in out, out
    progress_at, text, checkpoint_at = read_progress(rt.dir(a["worker"], 1))
    assert text == "step 7" and progress_at is not None and checkpoint_at is not None
    [report] = mark_progress(rt, [WorkerReport(worker=a["worker"], attempt=1, state="Running")])
    assert report.progress_text == "step 7" and report.checkpoint_at == checkpoint_at


def test_a_symlink_or_a_fifo_in_the_tenants_folder_is_no_progress(tmp_path):
    import os

    work = tmp_path / "work"
    work.mkdir()
    secret = tmp_path / "agent-secret"
    secret.write_text("not the tenant's\n")
    os.symlink(secret, work / ".astraeus-progress")
    os.symlink(secret, work / ".astraeus-checkpoint")
    assert read_progress(str(tmp_path)) == (None, None, None)
    (work / ".astraeus-progress").unlink()
    os.mkfifo(work / ".astraeus-progress")  # no writer: a blocking read would hang the agent's report
    assert read_progress(str(tmp_path)) == (None, None, None)
