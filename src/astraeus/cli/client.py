"""The CLI's HTTP client: where the API is (config file or environment), and errors as one clear line.

Configuration: `astra login --api URL --token T` writes $ASTRAEUS_CONFIG or ~/.config/astraeus/config.json;
the environment's ASTRAEUS_API / ASTRAEUS_TOKEN (which `astraeus up` writes) win over the file.

Several control plane replicas: the API URL may be several, comma-separated
(`http://cp1:8420/api/v1/o/ORG/w/WS,http://cp2:8420`; a URL without a path takes the first one's). The client
uses one at a time, and tries the next when one does not answer: for a GET on a connection error, a timeout or a
5xx; for anything else only when the connection could not be made (nothing was sent, so nothing can happen twice).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from astraeus import envvars

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
    env = envvars.copy() if env is None else env
    if env.get("ASTRAEUS_CONFIG"):
        return Path(env["ASTRAEUS_CONFIG"]).expanduser()
    return Path.home() / ".config" / "astraeus" / "config.json"


@dataclass(frozen=True)
class Config:
    api: str
    token: str


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """The API URL and token: the environment first, then the config file."""
    env = envvars.copy() if env is None else env
    saved: dict[str, Any] = {}
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
    path = urlsplit(urls[0]).path if "://" in urls[0] else ""
    out: list[str] = []
    for url in urls:
        if "://" in url and not urlsplit(url).path and path:
            url += path
        if url not in out:
            out.append(url)
    return out


IDEMPOTENT = ("GET", "HEAD", "OPTIONS")


def not_answering(e: Exception | None, status: int | None, method: str) -> bool:
    """Whether to try the next replica: a GET after a connection error, a timeout or a 5xx; anything else only
    when the connection was never made (so the request was not sent)."""
    if method.upper() in IDEMPOTENT:
        return (status is not None and status >= 500) or isinstance(e, httpx.TransportError)
    return isinstance(e, httpx.ConnectError | httpx.ConnectTimeout)


def error_message(response: httpx.Response) -> ApiError:
    """An API error answer → one line: `403 PRIORITY_NOT_ALLOWED: priority 60 is above …`."""
    status = response.status_code
    code: str | None = None
    message: str | None = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = body.get("code") if isinstance(body.get("code"), str) else None
        if isinstance(body.get("message"), str):
            message = body["message"]
        elif "detail" in body:  # the framework's own answers (unknown route, request validation)
            detail = body["detail"]
            if isinstance(detail, list) and detail and isinstance(detail[0], dict):
                loc = ".".join(str(p) for p in detail[0].get("loc", []) if p != "body")
                message = f"{loc}: {detail[0].get('msg', '')}" if loc else str(detail[0].get("msg", ""))
            else:
                message = str(detail)
    if message is None:
        text = response.text.strip().splitlines()
        message = text[0][:300] if text else response.reason_phrase or "no message"
    head = f"{status} {code}" if code else f"{status} {response.reason_phrase}".rstrip()
    msg = f"{head}: {message}"
    if status == 401:
        msg += " (check ASTRAEUS_TOKEN, or run `astra login` again)"
    return ApiError(msg, status=status, code=code)


def q(name: str) -> str:
    """A name as one path segment."""
    return quote(name, safe="")


class Client:
    def __init__(self, config: Config, timeout: float = 30.0, transport: httpx.BaseTransport | None = None):
        self.apis = api_urls(config.api)
        self.current = 0  # the replica in use: the one that answered last
        self.timeout = timeout
        for api in self.apis:
            try:
                httpx.URL(api + "/")
            except (httpx.InvalidURL, ValueError) as e:
                raise ApiError(f"the Astraeus API URL {api!r} is not valid: {e}") from None
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {config.token}", "User-Agent": "astra"},
            timeout=timeout,
            transport=transport,
        )

    @property
    def api(self) -> str:
        """The API URL in use."""
        return self.apis[self.current]

    def _url(self, path: str) -> str:
        path = path.lstrip("/")
        return f"{self.api}/{path}" if path else self.api  # the workspace itself: $API exactly, no trailing slash

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

    def _transport_error(self, e: Exception) -> ApiError:
        if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
            where = self.api if len(self.apis) == 1 else " or ".join(self.apis)
            return ApiError(f"cannot reach the Astraeus API at {where}: {e}")
        if isinstance(e, httpx.TimeoutException):
            return ApiError(f"the Astraeus API at {self.api} did not answer within {self.timeout:g}s")
        if isinstance(e, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return ApiError(f"the Astraeus API URL {self.api!r} is not valid: {e}")
        return ApiError(f"error talking to the Astraeus API at {self.api}: {e}")

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None) -> Any:
        """Send one request; the answer's JSON (or text when it is not JSON). Raises ApiError."""
        self._tried = 0
        while True:
            try:
                r = self._http.request(method, self._url(path), json=json_body, params=_params(params))
            except httpx.HTTPError as e:
                if not_answering(e, None, method) and self._next():
                    continue
                raise self._transport_error(e) from None
            if not_answering(None, r.status_code, method) and self._next():
                continue
            break
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
        """Text as it arrives (logs with follow=true): no read timeout."""
        timeout = httpx.Timeout(self.timeout, read=None)
        self._tried = 0
        while True:
            started = False  # once text was shown, another replica would show it again: no retry
            try:
                with self._http.stream("GET", self._url(path), params=_params(params), timeout=timeout) as r:
                    if r.status_code >= 500 and self._next():
                        continue
                    if r.status_code >= 400:
                        r.read()
                        raise error_message(r)
                    for text in r.iter_text():
                        started = True
                        yield text
                return
            except httpx.HTTPError as e:
                if not started and not_answering(e, None, "GET") and self._next():
                    continue
                raise self._transport_error(e) from None


def _params(params: dict[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    out: dict[str, Any] = {}
    for k, v in params.items():
        if v is None or v is False:
            continue
        out[k] = "true" if v is True else v
    return out or None
