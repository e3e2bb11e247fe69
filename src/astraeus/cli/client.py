"""The CLI's HTTP client: where the API is (config file or environment), and errors as one clear line.

Configuration: `astra login --api URL --token T` writes $ASTRAEUS_CONFIG or ~/.config/astraeus/config.json;
the environment's ASTRAEUS_API / ASTRAEUS_TOKEN (which `astraeus up` writes) win over the file.

Several control plane replicas: the API URL may be several, comma-separated
(`http://cp1:8420/api/v1/o/ORG/w/WS,http://cp2:8420`; a URL without a path takes the first one's). The client
uses one at a time, and tries the next when one does not answer: for a GET on a connection error, a timeout or a
5xx; for anything else only when the connection could not be made (nothing was sent, so nothing can happen twice).
"""

from __future__ import annotations

# Not httpx: a command starts in a fraction of the time (httpx imports rich and click with it). An http:// API is
# spoken to by astraeus.cli.wire (HTTP/1.1 on a socket: http.client imports ssl and email, a large part of a
# command's start); https:// by http.client. One keep-alive connection per replica serves a command's requests.
import _socket
import json
import os
import sys
from collections import namedtuple

from astraeus import envvars
from astraeus.cli import wire

TYPE_CHECKING = False  # typing and pathlib cost a command's start: neither is imported to run one
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from pathlib import Path
    from typing import Any

NO_CONFIG = ("no Astraeus API configured: run `astra login --api URL --token TOKEN`, "
             "or set ASTRAEUS_API and ASTRAEUS_TOKEN")


class ApiError(Exception):
    """A failure to show the user as one line (without a prefix), and the exit status to leave with."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None, exit_code: int = 1):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.exit_code = exit_code


def config_path(env: Mapping[str, str] | None = None) -> Path:
    from pathlib import Path

    env = envvars.copy() if env is None else env
    if env.get("ASTRAEUS_CONFIG"):
        return Path(env["ASTRAEUS_CONFIG"]).expanduser()
    return Path.home() / ".config" / "astraeus" / "config.json"


Config = namedtuple("Config", "api token")  # the API URL(s) and the token


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """The API URL and token: the environment first, then the config file."""
    env = envvars.copy() if env is None else env
    saved: dict[str, Any] = {}
    if env.get("ASTRAEUS_API") and env.get("ASTRAEUS_TOKEN"):
        return Config(api=env["ASTRAEUS_API"].rstrip("/"), token=env["ASTRAEUS_TOKEN"])  # the file is not read
    path = config_path(env)
    if path.exists():
        try:
            saved = json.loads(path.read_text())
            if not isinstance(saved, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            raise ApiError(f"cannot read the config file {path}: {e}; run `astra login` again") from None
    api = env.get("ASTRAEUS_API") or saved.get("api") or ""
    token = env.get("ASTRAEUS_TOKEN") or saved.get("token") or ""
    if not api or not token:
        missing = "ASTRAEUS_API" if not api else "ASTRAEUS_TOKEN"
        raise ApiError(f"{NO_CONFIG} ({missing} is not set)")
    return Config(api=api.rstrip("/"), token=token)


def org_config(env: Mapping[str, str] | None = None) -> Config:
    """The organisation's API ($ORG_API) for organisation-admin commands: the workspace API URL without its
    `/w/<workspace>`, with ASTRAEUS_ADMIN_TOKEN when set (else the token in use: it must be an organisation
    admin's)."""
    env = envvars.copy() if env is None else env
    config = load_config(env)
    urls = []
    for url in api_urls(config.api):
        base, sep, _ws = url.rpartition("/w/")
        if not sep or "/o/" not in base or "/" in _ws:
            raise ApiError(f"the Astraeus API URL {url} is not a workspace's ($API: http://HOST:PORT/api/v1/o/ORG/w/WS): "
                           "organisation commands use the organisation's part of it")
        urls.append(base)
    return Config(api=",".join(urls), token=env.get("ASTRAEUS_ADMIN_TOKEN") or config.token)


def save_config(api: str, token: str, env: Mapping[str, str] | None = None) -> Path:
    path = config_path(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"api": api.rstrip("/"), "token": token}, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def api_urls(api: str) -> list[str]:
    """The replicas' API URLs in `api` (one, or several comma-separated): a URL with no path takes the first
    one's path (`http://cp1:8420/api/v1/o/ORG/w/WS,http://cp2:8420`)."""
    urls = [u.strip().rstrip("/") for u in api.split(",")]
    urls = [u for u in urls if u]
    if not urls:
        return [api.rstrip("/")]
    path = split_url(urls[0]).path if "://" in urls[0] else ""
    out: list[str] = []
    for url in urls:
        if "://" in url and not split_url(url).path and path:
            url += path
        if url not in out:
            out.append(url)
    return out


IDEMPOTENT = ("GET", "HEAD", "OPTIONS")


class TransportError(Exception):
    """No answer from a replica. `connect`: the connection was never made, so nothing was sent."""

    def __init__(self, message: str, *, connect: bool = False, timeout: bool = False):
        super().__init__(message)
        self.connect = connect
        self.timeout = timeout


def not_answering(e: Exception | None, status: int | None, method: str) -> bool:
    """Whether to try the next replica: a GET after a connection error, a timeout or a 5xx; anything else only
    when the connection was never made (so the request was not sent)."""
    if method.upper() in IDEMPOTENT:
        return (status is not None and status >= 500) or isinstance(e, TransportError)
    return isinstance(e, TransportError) and e.connect


class Response(namedtuple("Response", "status_code reason_phrase headers content")):
    """An answer read whole: what error_message and the callers need of it (headers' names in lower case)."""

    __slots__ = ()

    @property
    def text(self) -> str:
        return self.content.decode(_charset(self.headers), errors="replace")

    def json(self) -> Any:
        return json.loads(self.text)


def _charset(headers: Mapping[str, str]) -> str:
    for part in headers.get("content-type", "").split(";")[1:]:
        k, _, v = part.strip().partition("=")
        if k.lower() == "charset" and v:
            return v.strip('"')
    return "utf-8"


def _field_messages(body: dict[str, Any]) -> list[str]:
    """Every field's message of a refused body: the API's `errors` [{field, message}], or the framework's
    `detail` [{loc, msg}]."""
    out = []
    for e in body.get("errors") or []:
        if isinstance(e, dict) and e.get("message"):
            out.append(f"{e['field']}: {e['message']}" if e.get("field") else str(e["message"]))
    if not out and isinstance(body.get("detail"), list):
        for d in body["detail"]:
            if isinstance(d, dict):
                loc = ".".join(str(p) for p in d.get("loc", []) if p != "body")
                out.append(f"{loc}: {d.get('msg', '')}" if loc else str(d.get("msg", "")))
    return out


def error_message(response: Any) -> ApiError:
    """An API error answer (a Response, or anything with status_code, reason_phrase, text and json()) → one
    line: `403 PRIORITY_NOT_ALLOWED: priority 60 is above …`; a refused body: every field's message, `; `-joined."""
    status = response.status_code
    code: str | None = None
    message: str | None = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = body.get("code") if isinstance(body.get("code"), str) else None
        fields = _field_messages(body)
        if len(fields) > 1:
            message = f"{len(fields)} fields to change: " + "; ".join(fields)
        elif isinstance(body.get("message"), str):
            message = body["message"]
        elif fields:
            message = fields[0]
        elif "detail" in body:  # the framework's own answers (unknown route)
            message = str(body["detail"])
    if message is None:
        text = response.text.strip().splitlines()
        message = text[0][:300] if text else response.reason_phrase or "no message"
    head = f"{status} {code}" if code else f"{status} {response.reason_phrase}".rstrip()
    msg = f"{head}: {message}"
    if status == 401:
        msg += " (check ASTRAEUS_TOKEN, or run `astra login` again)"
    return ApiError(msg, status=status, code=code)


# --- URLs: urllib.parse's answers; plain text (the usual case) without its import, which costs a command's start.
# tests/cli/test_client.py holds each fast path to urllib.parse's function.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_PLAIN_URL = _PLAIN | frozenset("/:")


class SplitUrl:
    """What the client reads of a URL: urllib.parse.urlsplit's fields of those names (`port`, as there, raises
    ValueError when read where it is no number)."""

    __slots__ = ("scheme", "hostname", "path", "query", "_port", "_parsed")

    def __init__(self, scheme: str, hostname: str | None, port: int | None, path: str, query: str, parsed=None):
        self.scheme, self.hostname, self._port, self.path, self.query = scheme, hostname, port, path, query
        self._parsed = parsed

    @property
    def port(self) -> int | None:
        return self._parsed.port if self._parsed is not None else self._port


def split_url(url: str) -> SplitUrl:
    """urlsplit(url)'s scheme, hostname, port, path and query."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if (sep and scheme in ("http", "https") and netloc and _PLAIN_URL.issuperset(netloc)
            and netloc.count(":") <= 1 and _simple_path(path)):
        host, colon, port = netloc.partition(":")
        path, _, query = ("/" + path if slash else "").partition("?")
        if port.isdigit() and port.isascii() or not colon:
            number = int(port) if port else None
            if number is None or number <= 65535:
                return SplitUrl(scheme, host.lower() or None, number, path, query)
    from urllib.parse import urlsplit  # anything else: urllib.parse's own answer (and its errors)

    p = urlsplit(url)
    return SplitUrl(p.scheme, p.hostname, None, p.path, p.query, p)


def _simple_path(path: str) -> bool:
    return "#" not in path and "%" not in path and path.isascii() and path.isprintable() and " " not in path


def q(name: str) -> str:
    """A name as one path segment (urllib.parse.quote(name, safe=""))."""
    if _PLAIN.issuperset(name):
        return name
    from urllib.parse import quote

    return quote(name, safe="")


def encode_query(query: dict[str, Any]) -> str:
    """urllib.parse.urlencode(query, doseq=True)."""
    parts = []
    for k, v in query.items():
        for one in v if isinstance(v, (list, tuple)) else (v,):
            text = one if isinstance(one, str) else str(one)
            if not (isinstance(k, str) and _PLAIN.issuperset(k) and _PLAIN.issuperset(text)
                    and isinstance(one, (str, int))):
                from urllib.parse import urlencode

                return urlencode(query, doseq=True)
            parts.append(f"{k}={text}")
    return "&".join(parts)


def _proxy(scheme: str, host: str) -> tuple[str, int] | None:
    """The proxy the environment names for `scheme` (HTTP(S)_PROXY, ALL_PROXY; NO_PROXY exempts hosts), as httpx
    read it: an http:// proxy's host and port."""
    env = envvars.copy()

    def var(name: str) -> str:
        return env.get(name.lower()) or env.get(name.upper()) or ""

    url = var(f"{scheme}_proxy") or var("all_proxy")
    if not url:
        return None
    for entry in (e.strip().lower() for e in var("no_proxy").split(",")):
        bare = entry.removeprefix("*").lstrip(".")
        if entry == "*" or (bare and (host.lower() == bare or host.lower().endswith("." + bare))):
            return None
    p = split_url(url if "://" in url else "http://" + url)
    if p.scheme != "http" or not p.hostname:
        raise ApiError(f"the proxy {url!r} in the environment is not an http://HOST:PORT URL: correct it or unset it")
    return p.hostname, p.port or 80


def _ssl_context() -> Any:
    """Verified TLS as httpx set it up: SSL_CERT_FILE, else SSL_CERT_DIR, else certifi's bundle."""
    import ssl

    if envvars.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=envvars.get("SSL_CERT_FILE"))
    if envvars.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=envvars.get("SSL_CERT_DIR"))
    try:
        import certifi
    except ImportError:  # the system's CAs
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


def _errors() -> tuple[type[BaseException], ...]:
    """What a connection raises when the server or the network fails it (http.client's only once it is in use)."""
    hc = sys.modules.get("http.client")
    return (OSError, wire.ProtocolError) + ((hc.HTTPException,) if hc is not None else ())


class _Connections:
    """One keep-alive connection per replica (scheme, host, port), opened on first use."""

    def __init__(self, headers: dict[str, str], timeout: float):
        self.headers = headers
        self.timeout = timeout
        self.open: dict[tuple[str, str, int], Any] = {}  # wire.Connection, or http.client's for https
        self._ssl: Any = None

    def close(self) -> None:
        for conn in self.open.values():
            conn.close()
        self.open.clear()

    def _connect(self, scheme: str, host: str, port: int, read_timeout: float | None
                 ) -> tuple[Any, bool, bool]:
        """A connected connection, whether it was used before, and whether it goes through a proxy."""
        key = (scheme, host, port)
        conn = self.open.get(key)
        proxy = _proxy(scheme, host)
        if conn is not None and conn.sock is not None and not _stale(conn.sock):
            conn.sock.settimeout(read_timeout)
            return conn, True, proxy is not None and scheme == "http"
        if conn is not None:
            conn.close()
        if scheme == "https":
            import http.client

            if self._ssl is None:
                self._ssl = _ssl_context()
            conn = http.client.HTTPSConnection(*(proxy or (host, port)), timeout=self.timeout, context=self._ssl)
            if proxy:
                conn.set_tunnel(host, port)
        else:
            conn = wire.Connection(*(proxy or (host, port)), timeout=self.timeout)
        self.open[key] = conn
        try:
            conn.connect()
        except TimeoutError as e:
            conn.close()
            raise TransportError(f"timed out connecting: {e}", connect=True, timeout=True) from None
        except _errors() as e:
            conn.close()
            raise TransportError(str(e) or type(e).__name__, connect=True) from None
        assert conn.sock is not None
        conn.sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        conn.sock.settimeout(read_timeout)
        return conn, False, proxy is not None and scheme == "http"

    def send(self, method: str, url: str, body: bytes | None, read_timeout: float | None
             ) -> Any:
        """Send one request, the answer's headers read (its body is the caller's to read). Raises TransportError."""
        parts = split_url(url)
        scheme, host = parts.scheme, parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            conn, reused, via_proxy = self._connect(scheme, host, port, read_timeout)
            target = url if via_proxy else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            sent = False
            try:
                conn.request(method, target, body=body, headers=headers)
                sent = True
                return conn.getresponse()
            except TimeoutError:
                conn.close()
                raise TransportError("timed out", timeout=True) from None
            except _errors() as e:
                conn.close()
                # A kept-alive connection the server closed meanwhile: once more on a new one (for other than a
                # GET only when the request could not be sent whole, so it was not applied).
                if attempt == 0 and reused and (method in IDEMPOTENT or not sent):
                    continue
                raise TransportError(str(e) or type(e).__name__) from None
        raise AssertionError("unreachable")


def _stale(sock: _socket.socket) -> bool:
    """Whether an idle kept-alive socket was closed by the server (it reads as ready: an end of file)."""
    import select

    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class Client:
    def __init__(self, config: Config, timeout: float = 30.0):
        self.apis = api_urls(config.api)
        self.current = 0  # the replica in use: the one that answered last
        self.timeout = timeout
        for api in self.apis:
            p = split_url(api)
            try:
                p.port  # noqa: B018 - raises on a port that is no number
            except ValueError as e:
                raise ApiError(f"the Astraeus API URL {api!r} is not valid: {e}") from None
            if p.scheme not in ("http", "https") or not p.hostname:
                raise ApiError(f"the Astraeus API URL {api!r} is not valid: give http(s)://HOST:PORT/api/v1/o/ORG/w/WS")
        self._http = _Connections({"Authorization": f"Bearer {config.token}", "User-Agent": "astra",
                                   "Accept": "*/*"}, timeout)

    @property
    def api(self) -> str:
        """The API URL in use."""
        return self.apis[self.current]

    def _url(self, path: str, params: dict[str, Any] | None = None) -> str:
        path = path.lstrip("/")
        url = f"{self.api}/{path}" if path else self.api  # the workspace itself: $API exactly, no trailing slash
        query = _params(params)
        if query:
            url += ("&" if "?" in url else "?") + encode_query(query)
        return url

    def _next(self) -> bool:
        """Move to the next replica; False when every one was tried since the last answer."""
        self._tried += 1
        if self._tried >= len(self.apis):
            return False
        self.current = (self.current + 1) % len(self.apis)
        return True

    _tried = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Client:
        return cls(load_config(env))

    @classmethod
    def org_from_env(cls, env: Mapping[str, str] | None = None) -> Client:
        """A client of $ORG_API (organisation-admin commands: org_config)."""
        return cls(org_config(env))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _transport_error(self, e: TransportError) -> ApiError:
        if e.connect and not e.timeout:
            where = self.api if len(self.apis) == 1 else " or ".join(self.apis)
            return ApiError(f"cannot reach the Astraeus API at {where}: {e}")
        if e.timeout:
            return ApiError(f"the Astraeus API at {self.api} did not answer within {self.timeout:g}s")
        return ApiError(f"error talking to the Astraeus API at {self.api}: {e}")

    def _send(self, method: str, path: str, body: bytes | None, params: dict[str, Any] | None,
              read_timeout: float | None) -> Any:
        """The answer of the replica in use, moving on as not_answering says. Raises ApiError."""
        self._tried = 0
        while True:
            try:
                r = self._http.send(method, self._url(path, params), body, read_timeout)
            except TransportError as e:
                if not_answering(e, None, method) and self._next():
                    continue
                raise self._transport_error(e) from None
            if not_answering(None, r.status, method) and self._next():
                r.read()
                continue
            return r

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None) -> Any:
        """Send one request; the answer's JSON (or text when it is not JSON). Raises ApiError."""
        body = None if json_body is None else json.dumps(json_body).encode()
        raw = self._send(method, path, body, params, self.timeout)
        try:
            r = Response(raw.status, raw.reason, {k.lower(): v for k, v in raw.getheaders()}, raw.read())
        except TimeoutError:
            self._http.close()
            raise self._transport_error(TransportError("timed out", timeout=True)) from None
        except _errors() as e:
            self._http.close()
            raise self._transport_error(TransportError(str(e) or type(e).__name__)) from None
        if r.status_code >= 400:
            raise error_message(r)
        if not r.content:
            return None
        if "json" in r.headers.get("content-type", ""):
            try:
                return r.json()
            except ValueError:
                raise ApiError(f"the Astraeus API at {self.api} answered with invalid JSON") from None
        return r.text

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any, **params: Any) -> Any:
        return self.request("POST", path, json_body=body, params=params)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json_body=body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json_body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def stream(self, path: str, **params: Any) -> Iterator[str]:
        """Text as it arrives (logs with follow=true): no read timeout. Once text was shown, another replica would
        show it again: no retry after that."""
        import codecs

        r = self._send("GET", path, None, params, None)
        if r.status >= 400:
            raise error_message(Response(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, r.read()))
        decoder = codecs.getincrementaldecoder(_charset({"content-type": r.getheader("content-type") or ""}))(
            errors="replace")
        try:
            while True:
                data = r.read1(65536)
                if not data:
                    break
                text = decoder.decode(data)
                if text:
                    yield text
        except TimeoutError:
            raise self._transport_error(TransportError("timed out", timeout=True)) from None
        except _errors() as e:
            raise self._transport_error(TransportError(str(e) or type(e).__name__)) from None
        finally:
            self._http.close()  # a stream's connection is not reused
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail


def _params(params: dict[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    out: dict[str, Any] = {}
    for k, v in params.items():
        if v is None or v is False:
            continue
        out[k] = "true" if v is True else v
    return out or None
