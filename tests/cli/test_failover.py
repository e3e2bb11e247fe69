"""`astra` with several control plane replicas in ASTRAEUS_API (comma-separated): a replica that refuses
connections is skipped for every request; one answering 5xx is skipped for a GET, never for a POST (the POST may
have been applied there: sending it again could submit the run twice)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from astraeus.cli.client import ApiError, Client, Config, api_urls
from tests.faults.conftest import Fleet, free_port

ASTRA = str(Path(sys.executable).parent / "astra")


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    """One real `astraeus server` (SQLite) standing for the replica that answers."""
    f = Fleet(tmp_path_factory.mktemp("cli-failover"))
    s = f.server()
    yield s
    f.close()


class Failing:
    """An HTTP server on 127.0.0.1 that answers every request 503 (a replica whose database is away, or a load
    balancer with no backend), counting what it was sent."""

    def __init__(self):
        hits = self.hits = []

        class H(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                hits.append((self.command, self.path))
                body = b'{"code": "UNAVAILABLE", "message": "the database is not answering"}'
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PUT = _answer

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def failing():
    f = Failing()
    yield f
    f.close()


def astra(api: str, token: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ASTRAEUS_API=api, ASTRAEUS_TOKEN=token, ASTRAEUS_CONFIG=str(tmp_path / "none.json"))
    return subprocess.run([ASTRA, *args], env=env, capture_output=True, text=True, timeout=60)


def run_body(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "python", "args": ["-c", "pass"],
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 28, "gpu_requests": {"count": 0}}}}}


def test_urls_without_a_path_take_the_first_ones():
    assert api_urls("http://cp1:8420/api/v1/o/acme/w/vision, http://cp2:8420/,http://cp3:8420") == [
        "http://cp1:8420/api/v1/o/acme/w/vision", "http://cp2:8420/api/v1/o/acme/w/vision",
        "http://cp3:8420/api/v1/o/acme/w/vision"]
    assert api_urls("http://cp1:8420/api/v1/o/acme/w/vision") == ["http://cp1:8420/api/v1/o/acme/w/vision"]


def test_a_replica_refusing_connections_is_skipped_for_gets_and_posts(replica, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    path = replica.api.split("127.0.0.1:")[1].split("/", 1)[1]
    api = f"{dead}/{path},{replica.url}"  # the live one gets the first one's path
    token = replica.vars["ASTRAEUS_TOKEN"]
    with Client(Config(api, token)) as c:
        assert c.post("runs", run_body("through-the-second"))["metadata"]["name"] == "through-the-second"
        assert c.api == replica.api  # and it stays on the one that answered
        assert c.get("runs/through-the-second")["metadata"]["name"] == "through-the-second"
    r = astra(api, token, tmp_path, "astraeus", "runs")
    assert r.returncode == 0, r.stderr
    assert "through-the-second" in r.stdout
    r = astra(api, token, tmp_path, "astraeus", "delete", "through-the-second")
    assert r.returncode == 0, r.stderr


def test_a_get_skips_a_replica_answering_5xx(replica, failing, tmp_path):
    api = f"{failing.url}/{replica.api.split('/', 3)[3]},{replica.url}"
    r = astra(api, replica.vars["ASTRAEUS_TOKEN"], tmp_path, "astraeus", "runs")
    assert r.returncode == 0, r.stderr
    assert failing.hits and all(m == "GET" for m, _ in failing.hits)


def test_a_post_answered_5xx_is_not_sent_again(replica, failing, tmp_path):
    api = f"{failing.url}/{replica.api.split('/', 3)[3]},{replica.url}"
    with Client(Config(api, replica.vars["ASTRAEUS_TOKEN"])) as c:
        with pytest.raises(ApiError) as e:
            c.post("runs", run_body("maybe-applied"))
        assert e.value.message == "503 UNAVAILABLE: the database is not answering"
        with pytest.raises(ApiError) as e:
            c.get("runs/maybe-applied")  # the GET moves on to the live replica: the run was not submitted there
        assert e.value.status == 404
    assert [m for m, _ in failing.hits] == ["POST", "GET"]


def test_every_replica_refusing_says_which_were_tried(tmp_path):
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    r = astra(f"{a}/api/v1/o/acme/w/vision,{b}", "t", tmp_path, "astraeus", "runs")
    assert r.returncode == 1
    assert r.stderr.startswith(f"error: cannot reach the Astraeus API at {a}/api/v1/o/acme/w/vision or "
                               f"{b}/api/v1/o/acme/w/vision: "), r.stderr
    assert "Traceback" not in r.stderr


def test_login_saves_every_replica_and_later_commands_use_them(replica, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    api = f"{dead}/{replica.api.split('/', 3)[3]},{replica.url}"
    env = {k: v for k, v in os.environ.items() if k not in ("ASTRAEUS_API", "ASTRAEUS_TOKEN")}
    env["ASTRAEUS_CONFIG"] = str(tmp_path / "config.json")
    p = subprocess.run([ASTRA, "login", "--api", api, "--token", replica.vars["ASTRAEUS_TOKEN"]], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Logged in to workspace vision"), p.stdout
    p = subprocess.run([ASTRA, "astraeus", "runs"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr



def test_following_logs_skips_a_replica_answering_5xx(replica, failing):
    api = f"{failing.url}/{replica.api.split('/', 3)[3]},{replica.url}"
    with Client(Config(api, replica.vars["ASTRAEUS_TOKEN"])) as c:
        with pytest.raises(ApiError) as e:
            "".join(c.stream("workers/nobody-0/logs", follow=True))
    assert e.value.status == 404  # the live replica's answer: no such worker
    assert failing.hits == [("GET", "/api/v1/o/acme/w/vision/workers/nobody-0/logs?follow=true")]
