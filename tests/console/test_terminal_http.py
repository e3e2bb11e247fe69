"""The run page's Terminal panel without a browser (httpx and a WebSocket client against a real local cluster with a
running worker): editors see it, viewers do not; the exec WebSocket signed in by the console's cookie needs the
console's own Origin and the session's CSRF token, still refuses a viewer, and then is the worker's shell."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.console.test_http import signed_in
from tests.faults.conftest import sleeper_run

pytestmark = pytest.mark.timeout(180)

RUN_PAGE = "/o/acme/w/vision/jobs/main/box"


@pytest.fixture(scope="module")
def box(console_cluster):
    """A running worker box-0, and a viewer's token."""
    c = console_cluster
    with c.client() as cl:
        assert cl.post("/runs", json=sleeper_run("box", gpus=0)).status_code == 201
        c.wait_for(lambda: cl.get("/workers/box-0").json()["state"] == "Running", 60, what="box-0 running")
    with c.admin() as a:
        r = a.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"})
        assert r.status_code == 201, r.text
    return r.json()["token"]


def exec_url(c, csrf: str) -> str:
    api = c.api.replace("http://", "ws://")
    return f"{api}/runs/box/exec?worker=0&tty=true&cols=100&rows=30&csrf={csrf}"


def panel(h: httpx.Client) -> tuple[str, str]:
    """The run page's Terminal panel: its exec URL and CSRF token (AssertionError when the page has none)."""
    r = h.get(RUN_PAGE)
    assert r.status_code == 200, r.text[:500]
    m = re.search(r'data-terminal="([^"]+)" data-csrf="([^"]+)"', r.text)
    assert m, "the run page has no Terminal panel"
    return m.group(1), m.group(2)


def exec_events(c) -> int:
    with c.client() as cl:
        return sum(e["kind"] == "Exec" for e in cl.get("/events", params={"limit": 500}).json()["items"])


def refusal(url: str, headers: dict) -> str:
    """The error frame a refused WebSocket answers with, before it closes."""
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        msg = json.loads(ws.recv(timeout=30))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
    assert msg["type"] == "error", msg
    return msg["message"]


def test_editors_see_the_terminal_and_viewers_do_not(console_cluster, box):
    c = console_cluster
    with signed_in(c, c.token) as h:
        url, csrf = panel(h)
        assert url == "/api/v1/o/acme/w/vision/runs/box/exec" and csrf
        assert "Open a shell" in h.get(RUN_PAGE).text
    with signed_in(c, box) as h:
        r = h.get(RUN_PAGE)
        assert r.status_code == 200 and "box" in r.text
        assert "terminal-panel" not in r.text and "data-terminal" not in r.text


def test_the_websocket_needs_the_cookie_the_consoles_origin_and_csrf(console_cluster, box):
    c = console_cluster
    before = exec_events(c)
    with signed_in(c, c.token) as h:
        _, csrf = panel(h)
        cookie = f"astraeus_session={h.cookies['astraeus_session']}"
    url = exec_url(c, csrf)
    # no cookie and no token: refused in the handshake
    with pytest.raises(InvalidStatus) as e:
        connect(url, additional_headers={"Origin": c.server}, open_timeout=30)
    assert e.value.response.status_code == 401
    assert "missing bearer token" in e.value.response.body.decode()
    # the cookie from another site's page (cross-site WebSocket hijacking), or with no Origin at all
    said = refusal(url, {"Cookie": cookie, "Origin": "https://evil.example"})
    assert "this session was opened from another site (https://evil.example), not from this console" in said
    assert "opened from another site (no Origin)" in refusal(url, {"Cookie": cookie})
    # the console's Origin but a wrong CSRF token
    said = refusal(exec_url(c, "not-the-token"), {"Cookie": cookie, "Origin": c.server})
    assert "the session's CSRF token is missing or wrong" in said and "reload the run's page" in said
    # a worker the run does not have: the API's words, shown in the terminal
    said = refusal(exec_url(c, csrf).replace("worker=0", "worker=5"), {"Cookie": cookie, "Origin": c.server})
    assert said == "run box has no worker 5: give --worker from 0 to 0"
    # a signed-out session's cookie opens nothing
    with signed_in(c, c.token) as h2:
        _, csrf2 = panel(h2)
        gone = f"astraeus_session={h2.cookies['astraeus_session']}"
        assert h2.post("/sign-out", data={"csrf": csrf2}, follow_redirects=False).status_code == 303
    assert "sign in to the console" in refusal(exec_url(c, csrf2), {"Cookie": gone, "Origin": c.server})
    assert exec_events(c) == before  # nothing recorded for a refused session


def test_a_viewer_signed_in_is_refused_with_the_apis_words(console_cluster, box):
    c = console_cluster
    with signed_in(c, box) as h:
        csrf = re.search(r'name="csrf" value="([^"]+)"', h.get(RUN_PAGE).text).group(1)
        cookie = f"astraeus_session={h.cookies['astraeus_session']}"
    said = refusal(exec_url(c, csrf), {"Cookie": cookie, "Origin": c.server})
    assert said == ("shell into a worker needs the editor role in workspace vision; this token has the viewer role: "
                    "use an editor's token")


def test_the_consoles_socket_is_the_workers_shell(console_cluster, box):
    c = console_cluster
    with signed_in(c, c.token) as h:
        _, csrf = panel(h)
        cookie = f"astraeus_session={h.cookies['astraeus_session']}"
    with connect(exec_url(c, csrf), additional_headers={"Cookie": cookie, "Origin": c.server},
                 open_timeout=30) as ws:
        ws.send(b"\x00" + b"echo $((6*7)); tty; exit 3\n")
        out, code = b"", None
        while code is None:
            m = ws.recv(timeout=30)
            if isinstance(m, bytes):
                assert m[0] in (1, 2)
                out += m[1:]
            else:
                msg = json.loads(m)
                assert msg["type"] == "exit", msg
                code = msg["code"]
    text = out.decode(errors="replace")
    assert re.search(r"^(\$ )?42\r?$", text, re.M) and re.search(r"/dev/pts/\d+", text), text
    assert code == 3
    with c.client() as cl:
        items = cl.get("/events", params={"limit": 50}).json()["items"]
    assert any(e["kind"] == "Exec" and "shell by token" in e["message"] and "a shell" in e["message"] for e in items)
