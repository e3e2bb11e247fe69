"""The CLI's HTTP client: where the API is (config file or environment), and errors as one clear line.

Configuration: `astra login --api URL --token T` writes $ASTRAEUS_CONFIG or ~/.config/astraeus/config.json;
the environment's ASTRAEUS_API / ASTRAEUS_TOKEN (which `astraeus up` writes) win over the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

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
    env = os.environ if env is None else env
    if env.get("ASTRAEUS_CONFIG"):
        return Path(env["ASTRAEUS_CONFIG"]).expanduser()
    return Path.home() / ".config" / "astraeus" / "config.json"


@dataclass(frozen=True)
class Config:
    api: str
    token: str


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """The API URL and token: the environment first, then the config file."""
    env = os.environ if env is None else env
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
        self.api = config.api
        self.timeout = timeout
        try:
            self._http = httpx.Client(
                base_url=config.api + "/",
                headers={"Authorization": f"Bearer {config.token}", "User-Agent": "astra"},
                timeout=timeout,
                transport=transport,
            )
        except (httpx.InvalidURL, ValueError) as e:
            raise ApiError(f"the Astraeus API URL {config.api!r} is not valid: {e}") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Client:
        return cls(load_config(env))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _transport_error(self, e: Exception) -> ApiError:
        if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
            return ApiError(f"cannot reach the Astraeus API at {self.api}: {e}")
        if isinstance(e, httpx.TimeoutException):
            return ApiError(f"the Astraeus API at {self.api} did not answer within {self.timeout:g}s")
        if isinstance(e, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return ApiError(f"the Astraeus API URL {self.api!r} is not valid: {e}")
        return ApiError(f"error talking to the Astraeus API at {self.api}: {e}")

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None) -> Any:
        """Send one request; the answer's JSON (or text when it is not JSON). Raises ApiError."""
        path = path.lstrip("/") or self.api  # the workspace itself: $API exactly, no trailing slash
        try:
            r = self._http.request(method, path, json=json_body, params=_params(params))
        except httpx.HTTPError as e:
            raise self._transport_error(e) from None
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

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, json_body=body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json_body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def stream(self, path: str, **params: Any) -> Iterator[str]:
        """Text as it arrives (logs with follow=true): no read timeout."""
        timeout = httpx.Timeout(self.timeout, read=None)
        try:
            with self._http.stream("GET", path.lstrip("/"), params=_params(params), timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise error_message(r)
                yield from r.iter_text()
        except httpx.HTTPError as e:
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
