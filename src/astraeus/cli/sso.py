"""`astra login --sso`: single sign-on by the OAuth 2.0 device authorization grant (RFC 8628).

The control plane names the organisation's provider and astra's client (GET $ORG_API/sso/cli); astra asks the
provider for a device code, says "Open URL and enter CODE", polls the provider's token endpoint until the person
has signed in there, and hands the ID token to the control plane (POST $ORG_API/sso/token), which checks it against
the provider's keys and answers with an Astraeus token of that person, saved as `astra login` saves one."""

from __future__ import annotations

import time
from collections.abc import Callable

from astraeus.cli.client import ApiError, Client, Config, api_urls

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def org_api(api: str) -> tuple[str, str]:
    """$ORG_API and the workspace of a workspace API URL ($API)."""
    url = api_urls(api)[0]
    base, sep, ws = url.rpartition("/w/")
    if not sep or "/o/" not in base or not ws or "/" in ws:
        raise ApiError(f"--api {url}: give the workspace API URL, http://HOST:PORT/api/v1/o/ORG/w/WS")
    return base, ws


def _provider_json(http, method: str, url: str, **kw) -> tuple[int, dict]:
    import httpx

    try:
        r = http.request(method, url, **kw)
        return r.status_code, r.json()
    except (httpx.HTTPError, ValueError) as e:
        raise ApiError(f"the sign-in provider did not answer at {url} ({e}): try again, or ask an admin to check "
                       "the single sign-on settings") from None


def device_login(api: str, say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> dict:
    """The device flow against the organisation's provider, then the control plane's token for the person who
    signed in: {token, user, workspace, role}."""
    import httpx

    base, ws = org_api(api)
    with Client(Config(api=base, token="")) as cp:
        client = cp.get("/sso/cli")
    with httpx.Client(timeout=30) as http:
        _s, doc = _provider_json(http, "GET", client["issuer"].rstrip("/") + "/.well-known/openid-configuration")
        if not doc.get("device_authorization_endpoint"):
            raise ApiError(f"the provider at {client['issuer']} offers no device flow (no "
                           "device_authorization_endpoint): sign in to the console instead, or use a token")
        status, dev = _provider_json(http, "POST", doc["device_authorization_endpoint"],
                                     data={"client_id": client["client_id"], "scope": client["scope"]})
        if status != 200:
            raise ApiError(f"the provider refused to start the sign-in: {dev.get('error_description') or dev}")
        url = dev.get("verification_uri_complete") or dev["verification_uri"]
        say(f"Open {dev['verification_uri']} and enter {dev['user_code']}")
        if dev.get("verification_uri_complete"):
            say(f"  (or open {url})")
        interval = float(dev.get("interval") or 5)
        deadline = time.monotonic() + float(dev.get("expires_in") or 600)
        while True:
            if time.monotonic() > deadline:
                raise ApiError("the code expired before the sign-in finished: run astra login --sso again")
            sleep(interval)
            status, tok = _provider_json(http, "POST", doc["token_endpoint"],
                                         data={"grant_type": DEVICE_GRANT, "device_code": dev["device_code"],
                                               "client_id": client["client_id"]})
            err = tok.get("error") if status != 200 else None
            if err == "authorization_pending":
                continue
            if err == "slow_down":
                interval += 5
                continue
            if err == "access_denied":
                raise ApiError("the sign-in was refused at the provider: run astra login --sso again")
            if err:
                raise ApiError(f"the provider did not sign you in ({err}: {tok.get('error_description', '')})")
            break
    if not tok.get("id_token"):
        raise ApiError("the provider gave no ID token: ask an admin to allow the openid scope for astra's client")
    with Client(Config(api=base, token="")) as cp:
        return cp.post("/sso/token", {"id_token": tok["id_token"], "workspace": ws})
