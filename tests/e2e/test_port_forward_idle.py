"""A port-forward keeps an interactive run attached (issue 44 follow-up): a notebook reached through `astra astraeus
port-forward` is in use, so the run's idle timeout waits while a forwarded connection is open, and counts from its
end. A real `astraeus up` (process runtime), the CLI's forward and a TCP connection through it."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.conftest import VENV_BIN, start_cluster, wait_for
from tests.e2e.test_exec import _free_port
from tests.faults.conftest import sleeper_run

pytestmark = pytest.mark.timeout(180)

ASTRA = str(VENV_BIN / "astra")
# Long enough for the worker to listen and the forward to connect before the run idles out, however loaded the
# machine (with 3 s, a connection through the forward once closed at once under the whole suite's load).
IDLE = 8


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("pf-idle") / "home", stop_grace=1.0)
    try:
        yield cluster
    finally:
        cluster.stop()


def status(c, name: str) -> dict:
    with c.client() as h:
        return h.get(f"/runs/{name}").json()["status"]


def events(c, kind: str, obj: str) -> int:
    with c.client() as h:
        return sum(e["kind"] == kind and e["object"] == obj for e in h.get("/events", params={"limit": 500}).json()["items"])


def test_an_open_port_forward_holds_an_interactive_run_past_its_idle_timeout(c):
    remote = _free_port()
    # one connection at a time: a greeting, then it reads until the other side is done, and closes
    serve = (f"import socket\ns = socket.create_server(('127.0.0.1', {remote}))\nprint('listening', flush=True)\n"
             "while True:\n    conn, _ = s.accept()\n    conn.sendall(b'hello\\n')\n"
             "    while conn.recv(1024):\n        pass\n    conn.close()\n")
    body = sleeper_run("nb", gpus=0, code=serve)
    body["spec"]["interactive"] = {"idle_timeout_seconds": IDLE}
    with c.client() as h:
        assert h.post("/runs", json=body).status_code == 201
    wait_for(lambda: status(c, "nb")["state"] == "Running", 60, interval=0.1, what="nb running")
    wait_for(lambda: "listening" in c.logs("nb-0"), 30, interval=0.1, what="nb listening on its port")
    local = _free_port()
    fwd = subprocess.Popen([ASTRA, "astraeus", "port-forward", "nb", f"{local}:{remote}"], env=c.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "Forwarding from" in fwd.stdout.readline()
        with socket.create_connection(("127.0.0.1", local), timeout=20) as conn:
            assert conn.recv(16) == b"hello\n"  # the session reached the worker's port
            wait_for(lambda: events(c, "PortForward", "nb-0") == 1, 20, what="the PortForward event")
            time.sleep(IDLE + 1)  # longer than the idle timeout, with the forwarded connection open
            assert status(c, "nb")["state"] == "Running"
        # the connection closed: its session ends, and the idle timeout counts from then
        wait_for(lambda: events(c, "ExecEnded", "nb-0") == 1, 20, what="the session's end recorded")
        wait_for(lambda: status(c, "nb")["state"] == "Cancelled", 60, interval=0.2, what="nb ended")
        assert status(c, "nb")["reason"] == f"No session attached for {IDLE}s: ended (idle timeout)"
    finally:
        fwd.terminate()
        fwd.wait(10)
        with c.client() as h:
            h.delete("/runs/nb")
