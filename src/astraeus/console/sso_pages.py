"""The console's single sign-on (docs/users.md "Single sign-on"): "Sign in with NAME" on the sign-in page sends the
browser to the organisation's OpenID Connect provider (authorization code + PKCE); its callback signs the user in
with a console session for a new token of that user. services/sso.py decides and talks to the provider."""

from __future__ import annotations

from urllib.parse import quote

import anyio.to_thread
from fastapi import Request
from fastapi.responses import RedirectResponse

from astraeus.console.base import base_url, cp_of, render, router, session_cookie, templates
from astraeus.server.services import ApiError, sso, tx
from astraeus.server.services.auth import open_console_session

CALLBACK = "/sso/callback"


def sso_buttons(request: Request) -> list[dict]:
    """The sign-in page's buttons: one per organisation with a provider (the template calls this)."""
    with cp_of(request).sessions() as s:
        return sso.sign_in_buttons(s)


templates.env.globals["sso_buttons"] = sso_buttons


def _next(nxt: str) -> str:
    return nxt if nxt.startswith("/") and not nxt.startswith("//") else "/"


def _refused(request: Request, e: ApiError):
    return render(request, "sign_in.html", None, status=e.status, next="/", error=e.message)


@router.get("/sso/{org}/start")
async def sso_start(request: Request, org: str, next: str = "/"):
    """To the provider's sign-in, with a fresh state and PKCE challenge."""

    def begin() -> str:
        with cp_of(request).sessions() as s, tx(s):
            return sso.begin_console_sign_in(s, org, _next(next), base_url(request) + CALLBACK)

    try:
        url = await anyio.to_thread.run_sync(begin)
    except ApiError as e:
        return _refused(request, e)
    return RedirectResponse(url, status_code=303)


@router.get(CALLBACK)
async def sso_callback(request: Request, state: str = "", code: str = "", error: str = "",
                       error_description: str = ""):
    """The provider sends the browser back here: the user signed in (a console session), or the reason not."""
    if error:
        return _refused(request, ApiError(401, "UNAUTHENTICATED", f"the provider did not sign you in ({error}: "
                                                                  f"{error_description or 'no reason given'}): try again"))
    hours = cp_of(request).settings.console_session_hours

    def finish() -> tuple[str, str]:
        with cp_of(request).sessions() as s, tx(s):
            issued, nxt = sso.finish_console_sign_in(s, state, code, base_url(request) + CALLBACK, hours)
            return open_console_session(s, issued["token_row"], hours), nxt

    try:
        cookie, nxt = await anyio.to_thread.run_sync(finish)
    except ApiError as e:
        return _refused(request, e)
    return session_cookie(request, RedirectResponse(quote(nxt, safe="/?=&"), status_code=303), cookie, hours)
