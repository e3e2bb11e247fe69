"""Request limits (docs/api.md, "Limits"): a body over the limit is refused with 413 before it is read, even
without a token, and the server's memory stays flat; labels and list fields have Kubernetes-like limits, and a
body over one is a 422 naming the field and the limit, with nothing stored."""

from __future__ import annotations

import os
import subprocess

import httpx
import psutil
import pytest

from tests.conftest import VENV_BIN, free_port, wait_for

MiB = 1 << 20


def run_body(name: str, labels: dict | None = None, **template) -> dict:
    tt = {"image": "python:3.11", "command": "true", **template}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"task_template": tt}}


# ------------------------------------------------------------------------------------------- body size


@pytest.fixture
def server(tmp_path):
    """`astraeus server` as a process of its own (its memory is what the test watches)."""
    port = free_port()
    home = tmp_path / "home"
    log = open(tmp_path / "server.log", "ab")
    env = dict(os.environ, ASTRAEUS_HOME=str(home))
    proc = subprocess.Popen([str(VENV_BIN / "astraeus"), "server", "--home", str(home), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(base + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 60, what="astraeus server to answer /healthz")
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def chunks(total: int, size: int = 256 * 1024):
    """`total` bytes of a JSON-looking body, made as they are sent (the client never holds them all)."""
    yield b'{"metadata": {"name": "big", "labels": {"x": "'
    sent = 0
    block = b"a" * size
    while sent < total:
        yield block
        sent += size
    yield b'"}}, "spec": {}}'


def post_streamed(url: str, total: int, content_length: bool) -> httpx.Response | None:
    """POST a `total`-byte body in chunks, without a token; the answer, or None when the server closed the
    connection before the client finished sending (it answered and stopped reading)."""
    headers = {"content-type": "application/json"}
    if content_length:
        headers["content-length"] = str(total + 64)
    try:
        return httpx.post(url, content=chunks(total), headers=headers, timeout=60)
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
        return None


@pytest.mark.parametrize("content_length", [True, False], ids=["content-length", "chunked"])
def test_a_50_mb_body_gets_413_before_it_is_read_and_memory_stays_flat(server, content_length):
    base, proc = server
    url = f"{base}/api/v1/o/acme/w/vision/runs"  # no token: the limit comes before authentication
    ps = psutil.Process(proc.pid)
    httpx.post(url, json=run_body("warm"), timeout=10)  # the first request's imports, not the body, grow it
    before = ps.memory_info().rss
    answers = [post_streamed(url, 50 * MiB, content_length) for _ in range(3)]
    after = ps.memory_info().rss
    got = [a for a in answers if a is not None]
    assert got, "the server never answered"
    for r in got:
        assert r.status_code == 413, r.text
        assert r.json()["code"] == "TOO_LARGE"
        assert "request body over 4 MiB" in r.json()["message"]
    assert after - before < 30 * MiB, f"the server grew by {(after - before) / MiB:.0f} MiB"
    # and it still serves
    assert httpx.get(base + "/healthz", timeout=5).status_code == 200
    r = httpx.post(url, json=run_body("small"), timeout=10)
    assert r.status_code == 401


def test_a_body_under_the_limit_is_read(app):
    """A run whose configs hold nearly 1 MiB (what the spec allows) is well under the body limit."""
    big = "x" * (1024 * 1024 - 100)
    body = run_body("cfg", configs=[{"mounts": ["/etc/app/big.txt"], "value": big}])
    r = app.client.post(f"{app.api}/runs", json=body, headers=app.h())
    assert r.status_code == 201, r.text


def test_a_body_over_the_limit_is_413_in_process(app):
    r = app.client.post(f"{app.api}/runs", content=b"{" + b" " * (5 * MiB) + b"}", headers=app.h())
    assert r.status_code == 413
    assert r.json()["code"] == "TOO_LARGE"
    assert app.client.get(f"{app.api}/runs", headers=app.h()).json()["items"] == []


# ------------------------------------------------------------------------------------------------ labels


@pytest.mark.parametrize(("labels", "field", "says"), [
    ({"k" * 64: "v"}, "metadata.labels", "64 characters, over the limit of 63"),
    ({"team": "v" * 64}, "metadata.labels", "64 characters, over the limit of 63"),
    ({"team": "v" * (20 * MiB // 8)}, "metadata.labels", "over the limit of 63"),
    ({f"k{i}": "v" for i in range(65)}, "metadata.labels", "at most 64 are allowed"),
    ({"te am": "v"}, "metadata.labels", "letters, digits, '-', '_' and '.'"),
    ({"team": "a b"}, "metadata.labels", "letters, digits, '-', '_' and '.'"),
    ({"Bad_Prefix/team": "v"}, "metadata.labels", "must be a DNS subdomain"),
    ({"-team": "v"}, "metadata.labels", "starting and ending with a letter or digit"),
], ids=["long-key", "long-value", "huge-value", "too-many", "key-char", "value-char", "prefix", "key-start"])
def test_label_limits_are_422_naming_the_field_and_nothing_is_stored(app, labels, field, says):
    r = app.client.post(f"{app.api}/runs", json=run_body("lab", labels), headers=app.h())
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "INVALID"
    assert body["message"].startswith(field + ": "), body["message"]
    assert says in body["message"], body["message"]
    assert len(r.content) < 4096  # a 20 MB value is not echoed back
    assert app.client.get(f"{app.api}/runs", headers=app.h()).json()["items"] == []


def test_labels_within_the_limits_are_kept(app):
    labels = {"example.com/team": "vision", "k" * 63: "v" * 63, "empty": "", "a.b_c-d": "X.y_z-1"}
    labels.update({f"k{i}": "v" for i in range(64 - len(labels))})
    r = app.client.post(f"{app.api}/runs", json=run_body("lab", labels), headers=app.h())
    assert r.status_code == 201, r.text
    assert app.client.get(f"{app.api}/runs/lab", headers=app.h()).json()["metadata"]["labels"] == labels


@pytest.mark.parametrize(("template", "field", "says"), [
    ({"args": ["a"] * 1025}, "spec.task_template.args", "at most 1024 args"),
    ({"env": {f"E{i}": "v" for i in range(257)}}, "spec.task_template.env", "at most 256 env entries"),
    ({"env": {f"E{i}": "v" * 30000 for i in range(10)}}, "spec.task_template.env", "over the limit of 256 KiB"),
    ({"env": {"E" * 300: "v"}}, "spec.task_template.env", "longer than 256 characters"),
    ({"configs": [{"mounts": [f"/c/{i}"], "value": ""} for i in range(65)]}, "spec.task_template.configs",
     "at most 64 items"),
    ({"configs": [{"mounts": [f"/c/{i}" for i in range(17)], "value": ""}]}, "spec.task_template.configs[0].mounts",
     "at most 16 items"),
    ({"configs": [{"mounts": ["/c/" + "x" * 5000], "value": ""}]}, "spec.task_template.configs[0].mounts",
     "longer than 4096 bytes"),
    ({"command": "x" * 5000}, "spec.task_template.command", "at most 4096 characters"),
    ({"requested_resources": {"node_selection": {"mode": "Labels", "labels": {"gpu": "a b"}}}},
     "spec.task_template.requested_resources.node_selection.labels", "letters, digits"),
], ids=["args", "env-entries", "env-bytes", "env-name", "configs", "mounts", "path", "command", "node-labels"])
def test_list_and_string_limits_are_422_naming_the_field(app, template, field, says):
    r = app.client.post(f"{app.api}/runs", json=run_body("lim", **template), headers=app.h())
    assert r.status_code == 422, r.text
    msg = r.json()["message"]
    assert msg.startswith(field + ": "), msg
    assert says in msg, msg
    assert app.client.get(f"{app.api}/runs", headers=app.h()).json()["items"] == []


def test_drive_labels_have_the_same_limits(app):
    body = {"metadata": {"name": "d1", "labels": {"team": "v" * 64}},
            "spec": {"sources": [{"node": "gpu-01", "path": "/data/astraeus/d1", "mount_path": "/data"}]}}
    r = app.client.post(f"{app.api}/drives", json=body, headers=app.h())
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith("metadata.labels: ")
    assert app.client.get(f"{app.api}/drives", headers=app.h()).json()["items"] == []


def test_limits_are_named_in_the_api_docs():
    from pathlib import Path

    from astraeus import spec as S

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    limits = text.split("## Limits", 1)[1]
    for n in (S.MAX_LABELS, S.MAX_LABEL_NAME, S.MAX_LABEL_PREFIX, S.MAX_ARGS, S.MAX_ENV_ENTRIES, S.MAX_CONFIGS,
              S.MAX_CONFIG_MOUNTS, S.MAX_DATAVOLUME_REFS, S.MAX_PATH, S.MAX_NODE_NAMES, S.MAX_ENV_NAME):
        assert f"{n}" in limits, n
    for name in ("ASTRAEUS_MAX_BODY_BYTES", "413", "TOO_LARGE", "ASTRAEUS_LOG_MAX_BYTES_PER_WORKER"):
        assert name in limits, name
