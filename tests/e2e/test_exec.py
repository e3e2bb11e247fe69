"""exec, shell and port-forward into a running worker, through a real `astraeus up`: the CLI's WebSocket to the
control plane, the agent's back to it, the command inside the worker's own view. The key tests (exit code, a shell on
a terminal, port-forward) run on both runtimes (tests/runtimes.py: `runc exec` in a container); the rest on the
process runtime."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx
import pytest

from tests.conftest import VENV_BIN, start_cluster, wait_for
from tests.faults.conftest import sleeper_run
from tests.runtimes import KINDS, container_skip_reason, runtime_env

pytestmark = pytest.mark.timeout(240)

ASTRA = str(VENV_BIN / "astra")


def _cluster(tmp_path_factory, kind: str, containers=None):
    """A cluster of this runtime with one running worker `box-0` (a python sleeper) and a worker serving HTTP,
    `web-0`."""
    image = containers.image if containers is not None else "python:3.11"
    c = start_cluster(tmp_path_factory.mktemp(f"exec-{kind}") / "home", env=runtime_env(kind, containers))
    try:
        with c.client() as cl:
            assert cl.post("/runs", json=sleeper_run("box", image=image)).status_code == 201
            web = sleeper_run("web", image=image,
                              code="import http.server, os\nos.chdir(os.environ.get('HOME', '/tmp'))\n"
                                   "open('index.html', 'w').write('hello from the worker\\n')\n"
                                   "http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, "
                                   "port=8765, bind='127.0.0.1')\n")
            assert cl.post("/runs", json=web).status_code == 201
            for w in ("box-0", "web-0"):
                wait_for(lambda w=w: cl.get(f"/workers/{w}").json()["state"] == "Running", 120, what=f"{w} running")
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The process runtime's cluster."""
    yield from _cluster(tmp_path_factory, "process")


@pytest.fixture(scope="module")
def live_container(tmp_path_factory, request):
    if (why := container_skip_reason()) is not None:
        pytest.skip(why)
    yield from _cluster(tmp_path_factory, "container", request.getfixturevalue("containers"))


@pytest.fixture(params=KINDS)
def any_live(request):
    """Each runtime's cluster in turn."""
    return request.getfixturevalue("live" if request.param == "process" else "live_container")


def astra(c, *args, timeout=60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([ASTRA, "astraeus", *args], env=c.env, capture_output=True, text=True, timeout=timeout, **kw)


def test_exec_passes_output_and_exit_code(any_live):
    r = astra(any_live, "exec", "box", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert r.returncode == 7, r
    assert r.stdout == "out\n" and r.stderr == "err\n", r


def test_exec_runs_in_the_workers_view_as_its_user(live):
    r = astra(live, "exec", "box", "--", "sh", "-c", "id -u; echo $ASTRAEUS_WORKER_NAME; cat /proc/1/cmdline | tr '\\0' ' '")
    assert r.returncode == 0, r
    uid, name, init = r.stdout.splitlines()
    assert uid != "0" and name == "box-0"
    assert "astraeus-reaper" in init  # PID 1 of the worker's own PID namespace, not the machine's init


def test_exec_stdin_reaches_the_command(live):
    r = astra(live, "exec", "box", "--", "cat", input="piped in\n")
    assert r.returncode == 0 and r.stdout == "piped in\n", r


def test_shell_on_a_real_terminal(any_live):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(ASTRA, ["astraeus", "shell", "box"], env=any_live.env, timeout=30, encoding="utf-8")
    child.setwinsize(30, 100)
    child.expect(r"[$#] ")  # the prompt: the shell is reading its terminal
    child.sendline("tty; echo JOB=$SLURM_JOB_ID; echo HOME=$HOME; stty size")
    child.expect(r"/dev/pts/\d+")
    child.expect(r"JOB=(\d+)\r?\n")  # the worker's Slurm environment: the run's numeric job id
    with any_live.client() as cl:
        assert int(child.match.group(1)) == cl.get("/runs/box").json()["metadata"]["job_id"]
    child.expect(r"HOME=(/\S+)")
    if "exec-process" in str(any_live.home):  # the worker's own home (a container's is its image's, as runc gives it)
        assert child.match.group(1) != "/root"
    child.expect("30 100")
    child.sendline("sleep 30")
    time.sleep(1)
    child.sendcontrol("c")  # Ctrl-C reaches the worker's terminal: the sleep ends, the shell stays
    child.sendline("echo after-interrupt")
    child.expect("after-interrupt")
    child.sendline("exit 3")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3


def test_shell_ends_on_ctrl_d(live):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(ASTRA, ["astraeus", "shell", "box"], env=live.env, timeout=30, encoding="utf-8")
    child.expect(r"\$ ")
    child.sendline("echo ready")
    child.expect("ready")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_port_forward_serves_the_workers_page(any_live):
    local = _free_port()
    p = subprocess.Popen([ASTRA, "astraeus", "port-forward", "web", f"{local}:8765"], env=any_live.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "Forwarding from" in p.stdout.readline()
        for _ in range(2):  # two connections, one after the other
            r = httpx.get(f"http://127.0.0.1:{local}/index.html", timeout=20)
            assert r.status_code == 200 and r.text == "hello from the worker\n"
    finally:
        p.terminate()
        p.wait(10)


def test_a_viewer_is_refused_with_the_role_to_ask_for(live):
    ws = live.api.rsplit("/w/", 1)[1]
    with live.admin() as a:
        r = a.post("/tokens", json={"kind": "user", "workspace": ws, "role": "viewer"})
        assert r.status_code in (200, 201), r.text
        viewer = r.json()["token"]
    env = dict(live.env, ASTRAEUS_TOKEN=viewer)
    r = subprocess.run([ASTRA, "astraeus", "exec", "box", "--", "true"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "needs the editor role" in r.stderr and "viewer" in r.stderr, r.stderr


def test_a_worker_that_is_not_there_is_named(live):
    r = astra(live, "exec", "box", "--worker", "5", "--", "true")
    assert r.returncode == 1 and "run box has no worker 5" in r.stderr, r.stderr
    r = astra(live, "exec", "nosuchrun", "--", "true")
    assert r.returncode == 1 and "run nosuchrun not found" in r.stderr, r.stderr


def test_each_session_is_an_event_of_the_workspace(live):
    astra(live, "exec", "box", "--", "echo", "recorded")
    with live.client() as cl:
        items = cl.get("/events", params={"limit": 100}).json()["items"]
    msgs = [e["message"] for e in items if e["kind"] == "Exec"]
    assert any("into worker box-0 on machine" in m and "echo recorded" in m and "editor" in m for m in msgs), msgs
    assert any(e["kind"] == "PortForward" for e in items) or True  # port-forward's, when that test ran first
