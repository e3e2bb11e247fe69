"""Configuration and error messages of the CLI's client (no server needed)."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from astraeus.cli.client import ApiError, Client, Config, Response, error_message, load_config, save_config


def test_env_wins_over_the_config_file(tmp_path):
    cfg = tmp_path / "config.json"
    env = {"ASTRAEUS_CONFIG": str(cfg)}
    save_config("http://file/api/v1/o/a/w/b/", "file-token", env)
    assert json.loads(cfg.read_text()) == {"api": "http://file/api/v1/o/a/w/b", "token": "file-token"}
    assert cfg.stat().st_mode & 0o777 == 0o600
    assert load_config(env) == Config("http://file/api/v1/o/a/w/b", "file-token")
    env.update(ASTRAEUS_API="http://env/api", ASTRAEUS_TOKEN="env-token")
    assert load_config(env) == Config("http://env/api", "env-token")


def test_default_config_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    from astraeus.cli.client import config_path

    assert config_path({}) == tmp_path / ".config" / "astraeus" / "config.json"


def test_no_config_says_what_to_do(tmp_path):
    with pytest.raises(ApiError) as e:
        load_config({"ASTRAEUS_CONFIG": str(tmp_path / "none.json")})
    assert "astra login" in e.value.message and "ASTRAEUS_API" in e.value.message


def test_broken_config_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text("{not json")
    with pytest.raises(ApiError, match="cannot read the config file"):
        load_config({"ASTRAEUS_CONFIG": str(p)})


def resp(status, body=None, text=None):
    from http import HTTPStatus

    if body is not None:
        return Response(status, HTTPStatus(status).phrase, {"content-type": "application/json"},
                        json.dumps(body).encode())
    return Response(status, HTTPStatus(status).phrase, {"content-type": "text/html"}, (text or "").encode())


def test_error_messages():
    e = error_message(resp(403, {"code": "PRIORITY_NOT_ALLOWED",
                                 "message": "priority 60 is above namespace ws-3f9c2a1b7d4e's maximum of 0"}))
    assert e.message == "403 PRIORITY_NOT_ALLOWED: priority 60 is above namespace ws-3f9c2a1b7d4e's maximum of 0"
    assert e.status == 403 and e.code == "PRIORITY_NOT_ALLOWED"
    assert error_message(resp(404, {"detail": "Not Found"})).message == "404 Not Found: Not Found"
    assert error_message(resp(422, {"detail": [{"loc": ["body", "spec", "x"], "msg": "bad"}]})).message == \
        "422 Unprocessable Entity: spec.x: bad"
    assert error_message(resp(502, text="<html>\nbad gateway")).message == "502 Bad Gateway: <html>"
    assert "astra login" in error_message(resp(401, {"code": "UNAUTHENTICATED", "message": "no"})).message


def test_connection_refused_is_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    api = f"http://127.0.0.1:{port}/api/v1/o/a/w/b"
    with Client(Config(api, "t")) as c, pytest.raises(ApiError) as e:
        c.get("runs")
    assert e.value.message.startswith(f"cannot reach the Astraeus API at {api}: ")


def test_every_field_of_a_refused_body_is_shown():
    body = {"code": "INVALID", "message": "metadata.name: field required",
            "errors": [{"field": "metadata.name", "message": "field required"},
                       {"field": "spec.task_template.image", "message": "unknown field: remove it or check its spelling"}]}
    assert error_message(resp(422, body)).message == (
        "422 INVALID: 2 fields to change: metadata.name: field required; "
        "spec.task_template.image: unknown field: remove it or check its spelling")
    one = {**body, "errors": body["errors"][:1]}
    assert error_message(resp(422, one)).message == "422 INVALID: metadata.name: field required"


def test_an_api_url_that_is_no_url_is_refused():
    for bad in ("cp1:8420/api", "ftp://cp1/api", "http://cp1:port/api"):
        with pytest.raises(ApiError, match="is not valid"):
            Client(Config(bad, "t"))


class _Api:
    """A plain HTTP(S) server on 127.0.0.1 answering {"path": …} to each GET, counting connections."""

    def __init__(self, context=None):
        import http.server
        import threading

        self.connections = 0
        api = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def setup(self):
                api.connections += 1
                super().setup()

            def do_GET(self):
                body = json.dumps({"path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if context is not None else "http"
        self.url = f"{scheme}://localhost:{self.httpd.server_address[1]}/api/v1/o/a/w/b"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_one_kept_alive_connection_serves_a_commands_requests():
    api = _Api()
    try:
        with Client(Config(api.url, "t")) as c:
            for i in range(5):
                assert c.get("runs", limit=i, label=["a=b", "c=d"])["path"] == (
                    f"/api/v1/o/a/w/b/runs?limit={i}&label=a%3Db&label=c%3Dd")
        assert api.connections == 1
    finally:
        api.close()


def test_tls_is_verified(tmp_path, monkeypatch):
    import shutil
    import ssl
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed (it makes the test's certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    api = _Api(ctx)
    try:
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with Client(Config(api.url, "t")) as c, pytest.raises(ApiError) as e:
            c.get("runs")  # certifi's CAs do not know this certificate
        assert e.value.message.startswith(f"cannot reach the Astraeus API at {api.url}: ")
        assert "CERTIFICATE_VERIFY_FAILED" in e.value.message
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # as httpx read it
        with Client(Config(api.url, "t")) as c:
            assert c.get("runs")["path"] == "/api/v1/o/a/w/b/runs"
    finally:
        api.close()


# --- the URL fast paths (astraeus.cli.client.split_url, q, encode_query) give urllib.parse's answers ----------
URLS = ["http://127.0.0.1:8420/api/v1/o/acme/w/vision", "http://cp1:8420", "https://Host.Example:443/a/b?x=1&y=2",
        "http://h", "http://h:/p", "http://h:0080/p", "http://[::1]:8420/api", "http://user@h:1/p", "HTTP://H:1/p",
        "http://h:1/a b", "http://h:1/a%20b", "http://h:1/p#frag", "http://h:1?x=1", "http://h:1/é", "http://:80/",
        "http://h:1//double", "ftp://h/x", "http://h.:1/p", "http://h:1/p?", "http://h:1/p?a=1?b"]


@pytest.mark.parametrize("url", URLS)
def test_split_url_is_urlsplit(url):
    from urllib.parse import urlsplit

    from astraeus.cli.client import split_url

    p, mine = urlsplit(url), split_url(url)
    assert (mine.scheme, mine.hostname, mine.port, mine.path, mine.query) == (p.scheme, p.hostname, p.port, p.path,
                                                                             p.query)


@pytest.mark.parametrize("url", ["http://h:99999/p", "http://h:x/p", "http://h:1:2/p"])
def test_split_url_refuses_what_urlsplit_refuses(url):
    from urllib.parse import urlsplit

    from astraeus.cli.client import split_url

    with pytest.raises(ValueError):
        urlsplit(url).port  # noqa: B018
    with pytest.raises(ValueError):
        split_url(url).port  # noqa: B018


@given(st.text(max_size=30))
def test_q_and_encode_query_are_urllibs(text):
    from urllib.parse import quote, urlencode

    from astraeus.cli.client import encode_query, q

    assert q(text) == quote(text, safe="")
    for query in ({"name": text}, {text or "k": ["a", text, 3]}, {"limit": 100, "state": text, "flag": True}):
        assert encode_query(query) == urlencode(query, doseq=True)
