"""The console's page machinery shared by every page module: the router the pages join, the templates, a page's
caller (`Page`: signed in by a console session or a bearer token), `render`, the `page` decorator that turns a
refusal into its page, and the form and origin checks. The page modules import this; it imports none of them."""

from __future__ import annotations

import functools
import hmac
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import anyio.from_thread
import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from astraeus.server import services
from astraeus.server.core import ControlPlane
from astraeus.server.db import ConsoleSession, Token, Workspace
from astraeus.server.lifecycle import RunState
from astraeus.server.routers.deps import control_plane
from astraeus.server.services import ApiError, Caller
from astraeus.units import human_bytes, human_duration, machine_mig, machine_shared, worker_gpus

HERE = Path(__file__).parent
COOKIE = services.CONSOLE_COOKIE  # a console session's own secret (never the API token)
CSRF_FIELD = "csrf"  # the hidden input every console form carries
STATES = tuple(s.value for s in RunState)  # the runs page's filter, in the order a run goes through them
TRANSPORTS = (("Auto", "RDMA when both have it, else TCP"), ("TCP", "TCP"), ("RDMA", "RDMA"))
STATIC = "/console/static"

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["bytes"] = human_bytes
templates.env.filters["duration"] = human_duration
# Issue 46: GPUs as `astra` shows them (a MIG worker's `2 × MIG 1g.10gb on GPU 0`, a machine's MIG devices free)
templates.env.filters["worker_gpus"] = worker_gpus
templates.env.filters["machine_mig"] = machine_mig
templates.env.filters["machine_shared"] = machine_shared
templates.env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False)
templates.env.globals["STATIC"] = STATIC
templates.env.globals["STATES"] = STATES
templates.env.globals["TRANSPORTS"] = TRANSPORTS


def static_files() -> StaticFiles:
    return StaticFiles(directory=str(HERE / "static"))


def age(t: float | None, at: float) -> str:
    return human_duration(max(1, at - t)) if t else ""


class Page:
    """What every signed-in page knows: who calls, in which organisation and workspace."""

    def __init__(self, s: Session, caller: Caller, ws: Workspace | None):
        self.caller = caller
        self.org = caller.org
        self.ws = ws
        self.org_admin = caller.org_admin
        self.role = caller.role
        if caller.org_admin:
            self.workspaces = [w.name for w in s.scalars(select(Workspace).where(Workspace.org_id == caller.org.id)
                                                         .order_by(Workspace.id))]
        else:
            self.workspaces = [ws.name] if ws else []

    @property
    def base(self) -> str:
        return f"/o/{self.org.name}/w/{self.ws.name}" if self.ws else f"/o/{self.org.name}"

    def cannot(self, role: str) -> str | None:
        """The API's refusal for this caller, or None when it may."""
        try:
            services.require(self.caller, role)
        except ApiError as e:
            return e.message
        return None


# ------------------------------------------------------------------------------------------- plumbing
def cp_of(request: Request) -> ControlPlane:
    return control_plane(request)


def base_url(request: Request) -> str:
    return cp_of(request).settings.console_base()


def authorization(request: Request) -> str | None:
    return request.headers.get("authorization")


# ------------------------------------------------------------------------------------ console sessions
def own_origins(request: HTTPConnection) -> set[str]:
    """The origins this console is reached at: the request's own (scheme as X-Forwarded-Proto says, else as
    the connection is) and ASTRAEUS_PUBLIC_URL's."""
    return services.own_origins(request.url.scheme, request.headers.get("host") or request.url.netloc,
                                request.headers.get("x-forwarded-proto"), cp_of(request).settings.public_url)


def check_origin(request: Request) -> None:
    """A POST must come from the console's own pages: refused when its Origin (or, without one, its Referer)
    names another origin. Scripts that send neither (curl, httpx) pass; they authenticate with a header."""
    origin = request.headers.get("origin")
    if origin is None and request.headers.get("referer"):
        u = urlsplit(request.headers["referer"])
        origin = f"{u.scheme}://{u.netloc}"
    if origin is not None and origin.lower() not in own_origins(request):
        raise ApiError(403, "FORBIDDEN", f"this form was sent from another site ({origin}), not from this console: "
                                         "open the console and send it from there")


def secure_cookie(request: Request) -> bool:
    """`Secure` when the console is served over HTTPS: ASTRAEUS_PUBLIC_URL is https://, or the request came over
    HTTPS (its own scheme, or X-Forwarded-Proto: https from a proxy that ends TLS)."""
    public = cp_of(request).settings.public_url or ""
    proto = (request.headers.get("x-forwarded-proto") or request.url.scheme).split(",")[0].strip().lower()
    return public.startswith("https://") or proto == "https"


def session_cookie(request: Request, resp: Response, cookie: str, hours: float) -> Response:
    """The new console session's cookie on `resp`: HttpOnly, SameSite=Lax, Secure over HTTPS; never the token."""
    resp.set_cookie(COOKIE, cookie, httponly=True, samesite="lax", secure=secure_cookie(request),
                    max_age=int(hours * 3600), path="/")
    return resp


def console_session(s: Session, request: Request) -> ConsoleSession | None:
    """The signed-in session the cookie names, when it is live (not signed out, not expired)."""
    return services.live_console_session(s, request.cookies.get(COOKIE))


def token_of(s: Session, request: Request) -> Token:
    """The API token a page acts as: an `Authorization: Bearer` header's, or the console session's. A POST
    signed in by cookie must come from this console (Origin) and carry the session's CSRF token."""
    if request.method == "POST":
        check_origin(request)
    if authorization(request):
        tok = services.authenticate(s, authorization(request))
    else:
        cs = console_session(s, request)
        tok = services.console_token(s, cs)
        if request.method == "POST":
            sent = read_form(request).get(CSRF_FIELD, "")
            if not hmac.compare_digest(sent.encode(), cs.csrf.encode()):
                raise ApiError(403, "FORBIDDEN", "the form's CSRF token is missing or wrong (an old page, or a "
                                                 "form from another site): reload the page and send it again")
        request.state.csrf = cs.csrf
    if tok.kind == "machine":
        raise ApiError(403, "FORBIDDEN", "a machine token cannot call user endpoints")
    return tok


def ws_page(s: Session, request: Request, org: str, ws: str) -> Page:
    c = services.workspace_caller(s, token_of(s, request), org, ws)
    return Page(s, c, c.workspace)


def admin_page(s: Session, request: Request, org: str) -> Page:
    c = services.org_admin_caller(s, token_of(s, request), org)
    ws = s.scalar(select(Workspace).where(Workspace.org_id == c.org.id).order_by(Workspace.id))
    return Page(s, c, ws)


def render(request: Request, name: str, page: Page | None, status: int = 200, **ctx: Any) -> HTMLResponse:
    csrf = getattr(request.state, "csrf", "")
    return templates.TemplateResponse(request, name, {"p": page, "csrf": csrf, **ctx}, status_code=status)


def error_page(request: Request, e: ApiError) -> Response:
    if e.status == 401 and "authorization" not in request.headers:
        return RedirectResponse(f"/sign-in?next={quote(request.url.path)}", status_code=303)
    return render(request, "error.html", None, status=e.status, error=e)


def page(fn):
    """A page handler: an ApiError becomes the error page (or the sign-in page for a missing token)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ApiError as e:
            return error_page(kwargs["request"], e)

    return wrapper


def read_form(request: Request) -> dict[str, str]:
    return {k: str(v) for k, v in anyio.from_thread.run(request.form).items()}


def parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:  # as FastAPI reports a body that is not JSON
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}]) from None


def default_access(s: Session, request: Request, c: Caller) -> dict | None:
    view = services.workspace_view(s, c, base_url(request))
    return view["clusters"][0] if view["clusters"] else None
