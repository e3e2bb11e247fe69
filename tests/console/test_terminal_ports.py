"""The run page's "Open port" (httpx against a real local cluster with a worker serving HTTP): a GET reaches the
worker's server through a port-forward session and comes back sandboxed; a port that is not one, a port nothing
listens on, a viewer and a signed-out browser are each told what to change, and nothing is recorded for them."""

from __future__ import annotations

import pytest

from tests.console.test_http import signed_in
from tests.faults.conftest import sleeper_run

pytestmark = pytest.mark.timeout(180)

RUN = "/o/acme/w/vision/jobs/main/web"
SERVE = ("import http.server, os\nos.chdir(os.environ.get('HOME', '/tmp'))\n"
         "os.makedirs('sub', exist_ok=True)\n"
         "open('index.html', 'w').write('<p>hello from the worker</p><script>parent.x = 1</script>')\n"
         "open('sub/data.json', 'w').write('{\"answer\": 42}')\n"
         "http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port=8765, bind='127.0.0.1')\n")


@pytest.fixture(scope="module")
def web(console_cluster):
    """A running worker web-0 serving HTTP on 127.0.0.1:8765 inside it, and a viewer's token."""
    c = console_cluster
    with c.client() as cl:
        assert cl.post("/runs", json=sleeper_run("web", gpus=0, code=SERVE)).status_code == 201
        c.wait_for(lambda: cl.get("/workers/web-0").json()["state"] == "Running", 60, what="web-0 running")
    with c.admin() as a:
        r = a.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"})
        assert r.status_code == 201, r.text
    return r.json()["token"]


def forward_events(c) -> int:
    with c.client() as cl:
        return sum(e["kind"] == "PortForward" for e in cl.get("/events", params={"limit": 500}).json()["items"])


def test_the_run_page_links_a_port_and_the_worker_answers(console_cluster, web):
    c = console_cluster
    before = forward_events(c)
    with signed_in(c, c.token) as h:
        page = h.get(RUN).text
        assert 'id="open-port"' in page and 'action="/o/acme/w/vision/jobs/main/web/open-port"' in page
        r = h.get(RUN + "/open-port", params={"port": " 8765 ", "worker": "0"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == RUN + "/workers/0/ports/8765/"
        r = h.get(r.headers["location"])
        assert r.status_code == 200, r.text[:500]
        assert "hello from the worker" in r.text
        assert r.headers["content-security-policy"] == "sandbox allow-same-origin"  # its script does not run
        assert "set-cookie" not in r.headers
        r = h.get(RUN + "/workers/0/ports/8765/sub/data.json")
        assert r.status_code == 200 and r.json() == {"answer": 42}
        r = h.get(RUN + "/workers/0/ports/8765/sub", follow_redirects=False)  # its redirect stays below the page
        assert r.status_code == 301 and r.headers["location"] == RUN + "/workers/0/ports/8765/sub/"
        assert h.get(RUN + "/workers/0/ports/8765/nope.txt").status_code == 404
    assert forward_events(c) == before + 4  # one session per request, each recorded


def test_bad_ports_are_refused_with_what_to_change(console_cluster, web):
    c = console_cluster
    before = forward_events(c)
    with signed_in(c, c.token) as h:
        r = h.get(RUN + "/open-port", params={"port": "http", "worker": "0"})
        assert r.status_code == 422 and "port: &#39;http&#39; is not a TCP port; give one from 1 to 65535" in r.text
        r = h.get(RUN + "/workers/0/ports/70000/")
        assert r.status_code == 422 and "port: 70000 is not a TCP port; give one from 1 to 65535" in r.text
        r = h.get(RUN + "/workers/3/ports/8765/")
        assert r.status_code == 404 and "run web has no worker 3" in r.text
        r = h.get("/o/acme/w/vision/jobs/other/web/workers/0/ports/8765/")
        assert r.status_code == 404 and "run web not found in workspace vision on cluster other" in r.text
    assert forward_events(c) == before  # nothing recorded for them
    with signed_in(c, c.token) as h:
        r = h.get(RUN + "/workers/0/ports/8766/")  # a session, but nothing listens there
        assert r.status_code == 502 and "nothing answers on port 8766 inside the worker" in r.text


def test_viewers_and_signed_out_browsers_get_no_port(console_cluster, web):
    c = console_cluster
    before = forward_events(c)
    with signed_in(c, web) as h:
        assert 'id="open-port"' not in h.get(RUN).text
        r = h.get(RUN + "/workers/0/ports/8765/")
        assert r.status_code == 403
        assert ("port-forward into a worker needs the editor role in workspace vision; this token has the viewer "
                "role: use an editor&#39;s token") in r.text
    with signed_in(c, c.token) as h:
        h.cookies.clear()
        r = h.get(RUN + "/workers/0/ports/8765/", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/sign-in?next=")
    assert forward_events(c) == before
