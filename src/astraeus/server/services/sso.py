"""Single sign-on with OpenID Connect (issue 45, docs/users.md "Single sign-on"), through Authlib.

An organisation admin names the provider (issuer, the console's client, the CLI's client), how a signed-in person is
found (`sub` or `email`) and which of the provider's groups give which role in which workspace. The console signs in
by authorization code + PKCE (`begin_console_sign_in`, `finish_console_sign_in`); `astra login --sso` runs the device
flow against the provider and hands its ID token to `token_for_id_token`. Both end in `sign_in`: the user found or
made, its roles set from its groups, and a token of that user. What decides (`check_config`, `roles_for`,
`refusal`, `user_name_for`) is pure; the rest reads the provider and the database."""

from __future__ import annotations

import base64
import json
import re
import secrets
import time
from urllib.parse import urlencode, urlsplit

import httpx
from authlib.integrations.httpx_client import OAuth2Client
from authlib.jose import JsonWebKey, jwt
from authlib.jose.errors import JoseError
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.server.db import ConsoleSession, Org, SsoLogin, SsoProvider, Token, User, UserRole, Workspace
from astraeus.server.services.auth import ROLES, Caller, create_token, digest
from astraeus.server.services.errors import ApiError

MATCH_BY = ("sub", "email")
SCOPES = "openid email profile groups"
LOGIN_SECONDS = 600  # a console sign-in must come back from the provider within this
PROVIDER_TIMEOUT = 10.0


# ------------------------------------------------------------------------------------------------- deciding
def check_config(body: dict, workspaces: set[str], old: SsoProvider | None) -> dict:
    """The provider settings an admin sent, checked: each wrong field refused with what to change."""
    if not isinstance(body, dict):
        raise ApiError(422, "INVALID", "give an object: {issuer, client_id, client_secret, roles, ...}")
    issuer = body.get("issuer", old.issuer if old else None)
    u = urlsplit(issuer) if isinstance(issuer, str) else None
    if u is None or u.scheme not in ("http", "https") or not u.netloc or u.query or u.fragment:
        raise ApiError(422, "INVALID", f"issuer: {issuer!r} is not the provider's issuer URL: give it as its "
                                       "discovery document says (https://accounts.example.org/realms/main)")
    out = {"issuer": issuer.rstrip("/")}
    for field, need in (("client_id", True), ("cli_client_id", False)):
        v = body.get(field, getattr(old, field) if old else None)
        if v is None and not need:
            out[field] = None
            continue
        if not isinstance(v, str) or not v.strip() or len(v) > 200:
            raise ApiError(422, "INVALID", f"{field}: give the client id the provider registered for "
                                           f"{'the console' if field == 'client_id' else 'astra login --sso'}")
        out[field] = v.strip()
    secret = body.get("client_secret", old.client_secret if old else None)
    if secret is not None and (not isinstance(secret, str) or not secret or len(secret) > 500):
        raise ApiError(422, "INVALID", "client_secret: give the console client's secret as the provider shows it")
    out["client_secret"] = secret
    name = body.get("name", old.name if old else None) or u.hostname
    if not isinstance(name, str) or len(name) > 100:
        raise ApiError(422, "INVALID", "name: give the provider's name for the sign-in button (at most 100 characters)")
    out["name"] = name
    match_by = body.get("match_by", old.match_by if old else "sub")
    if match_by not in MATCH_BY:
        raise ApiError(422, "INVALID", f"match_by: {match_by!r}: give sub (the provider's subject) or email")
    out["match_by"] = match_by
    claim = body.get("groups_claim", old.groups_claim if old else "groups")
    if not isinstance(claim, str) or not re.fullmatch(r"[A-Za-z0-9_.:/-]{1,100}", claim):
        raise ApiError(422, "INVALID", f"groups_claim: {claim!r}: give the name of the ID token's claim that lists "
                                       "the user's groups (groups)")
    out["groups_claim"] = claim
    roles = body.get("roles", {g: dict(m) for g, m in (old.roles or {}).items()} if old else None)
    if not isinstance(roles, dict) or not roles:
        raise ApiError(422, "INVALID", "roles: map at least one of the provider's groups to workspace roles: "
                                       '{"ml-editors": {"vision": "editor"}}')
    for group, grants in roles.items():
        if not isinstance(grants, dict) or not grants:
            raise ApiError(422, "INVALID", f"roles.{group}: give {{workspace: viewer|editor|admin}}")
        for ws, role in grants.items():
            if ws not in workspaces:
                raise ApiError(422, "INVALID", f"roles.{group}.{ws}: no workspace named {ws!r}: create it first or "
                                               "name another")
            if role not in ROLES:
                raise ApiError(422, "INVALID", f"roles.{group}.{ws}: unknown role {role!r}: give viewer, editor or "
                                               "admin")
    out["roles"] = roles
    return out


def groups_of(claims: dict, claim: str) -> list[str]:
    g = claims.get(claim)
    if isinstance(g, str):
        return [g]
    return [str(x) for x in g] if isinstance(g, list) else []


def roles_for(groups: list[str], mapping: dict) -> dict[str, str]:
    """{workspace: role} the groups give: the highest role any of them gives in each workspace."""
    out: dict[str, str] = {}
    for g in groups:
        for ws, role in (mapping.get(g) or {}).items():
            if ws not in out or ROLES.index(role) > ROLES.index(out[ws]):
                out[ws] = role
    return dict(sorted(out.items()))


def refusal(who: str, groups: list[str]) -> str:
    listed = ", ".join(groups) if groups else "none"
    return (f"Signed in as {who}, but none of your groups ({listed}) is given a role here: ask an admin to map one "
            "(PUT $ORG_API/sso roles)")


def user_name_for(claims: dict, taken: set[str]) -> str:
    """A DNS-label name for a new user: the provider's preferred_username, else the email's local part."""
    raw = claims.get("preferred_username") or (claims.get("email") or "").split("@")[0] or "user"
    base = re.sub(r"[^a-z0-9-]+", "-", str(raw).lower()).strip("-")[:50] or "user"
    if base[0].isdigit():
        base = "u-" + base
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


# ---------------------------------------------------------------------------------------- the configuration
def provider_of(s: Session, org: Org) -> SsoProvider | None:
    return s.scalar(select(SsoProvider).where(SsoProvider.org_id == org.id))


def config_out(p: SsoProvider | None) -> dict:
    """The settings as an admin reads them back: never the client secret, only whether one is set."""
    if p is None:
        return {"configured": False}
    return {"configured": True, "name": p.name, "issuer": p.issuer, "client_id": p.client_id,
            "client_secret_set": bool(p.client_secret), "cli_client_id": p.cli_client_id, "match_by": p.match_by,
            "groups_claim": p.groups_claim, "roles": p.roles}


def set_config(s: Session, c: Caller, body: dict) -> dict:
    old = provider_of(s, c.org)
    names = set(s.scalars(select(Workspace.name).where(Workspace.org_id == c.org.id)))
    conf = check_config(body, names, old)
    p = old or SsoProvider(org_id=c.org.id)
    for k, v in conf.items():
        setattr(p, k, v)
    p.updated_at = time.time()
    s.add(p)
    s.flush()
    return config_out(p)


def delete_config(s: Session, c: Caller) -> None:
    p = provider_of(s, c.org)
    if p is not None:
        s.delete(p)
        s.flush()


def sign_in_buttons(s: Session) -> list[dict]:
    """The console sign-in page's "Sign in with NAME" buttons: one per organisation with a provider."""
    rows = s.execute(select(Org.name, SsoProvider.name).join(SsoProvider, SsoProvider.org_id == Org.id)
                     .order_by(Org.name)).all()
    return [{"org": o, "name": n} for o, n in rows]


# ------------------------------------------------------------------------------------------- the provider
def discover(issuer: str) -> dict:
    """The provider's discovery document (/.well-known/openid-configuration)."""
    try:
        r = httpx.get(issuer + "/.well-known/openid-configuration", timeout=PROVIDER_TIMEOUT)
        r.raise_for_status()
        doc = r.json()
    except (httpx.HTTPError, ValueError) as e:
        raise ApiError(502, "PROVIDER_UNREACHABLE", f"the sign-in provider at {issuer} did not answer its discovery "
                                                    f"document ({e}): check the issuer URL (PUT $ORG_API/sso)") from None
    if doc.get("issuer", "").rstrip("/") != issuer:
        raise ApiError(502, "PROVIDER_MISMATCH", f"the provider at {issuer} calls itself {doc.get('issuer')!r}: set "
                                                 "issuer to exactly that")
    return doc


def unverified_issuer(id_token: str) -> str | None:
    """The `iss` an ID token claims, read without checking anything (only to refuse a stranger's token early)."""
    try:
        payload = id_token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, IndexError):
        return None
    iss = claims.get("iss") if isinstance(claims, dict) else None
    return iss.rstrip("/") if isinstance(iss, str) else None


def verify_id_token(p: SsoProvider, doc: dict, id_token: str, audiences: list[str], nonce: str | None) -> dict:
    """The ID token's claims once its signature (the provider's JWKS), issuer, audience, expiry and nonce hold."""
    try:
        keys = JsonWebKey.import_key_set(httpx.get(doc["jwks_uri"], timeout=PROVIDER_TIMEOUT).json())
        opts = {"iss": {"essential": True, "value": p.issuer}, "aud": {"essential": True, "values": audiences},
                "sub": {"essential": True}}
        if nonce is not None:
            opts["nonce"] = {"essential": True, "value": nonce}
        claims = jwt.decode(id_token, keys, claims_options=opts)
        claims.validate(leeway=60)
    except (JoseError, ValueError, KeyError, httpx.HTTPError) as e:
        raise ApiError(401, "UNAUTHENTICATED", f"the provider's ID token was not accepted ({e}): sign in again") \
            from None
    return dict(claims)


# ----------------------------------------------------------------------------------------------- signing in
def sign_in(s: Session, org: Org, p: SsoProvider, claims: dict, workspace: str | None,
            expires_in: float | None) -> dict:
    """The signed-in person's user (found by sub or email, made when new), its roles in the mapped workspaces set
    from its groups, and a new token of it: in `workspace`, or the first workspace it has a role in."""
    groups = groups_of(claims, p.groups_claim)
    who = claims.get("email") or claims.get("preferred_username") or claims["sub"]
    roles = roles_for(groups, p.roles)
    if not roles:
        raise ApiError(403, "FORBIDDEN", refusal(who, groups))
    if p.match_by == "email":
        if not claims.get("email"):
            raise ApiError(403, "FORBIDDEN", f"the provider sent no email for {who}: ask an admin to match users by "
                                             "sub, or add the email scope to the provider's client")
        u = s.scalar(select(User).where(User.org_id == org.id, User.email == claims["email"]))
    else:
        u = s.scalar(select(User).where(User.org_id == org.id, User.sso_subject == claims["sub"]))
    if u is None:
        taken = set(s.scalars(select(User.name).where(User.org_id == org.id)))
        u = User(org_id=org.id, name=user_name_for(claims, taken), kind="person",
                 display_name=str(claims.get("name") or "")[:200], org_admin=False)
        s.add(u)
    u.sso_subject = claims["sub"]
    if claims.get("email"):
        u.email = str(claims["email"])[:255]
    s.flush()
    by_name = {w.name: w for w in s.scalars(select(Workspace).where(Workspace.org_id == org.id))}
    mapped = {ws for grants in p.roles.values() for ws in grants}
    for ws_name in mapped & set(by_name):  # the mapping decides the roles in the workspaces it names
        row = s.scalar(select(UserRole).where(UserRole.user_id == u.id, UserRole.workspace_id == by_name[ws_name].id))
        role = roles.get(ws_name)
        if role is None and row is not None:
            s.delete(row)
        elif role is not None and row is None:
            s.add(UserRole(user_id=u.id, workspace_id=by_name[ws_name].id, role=role))
        elif role is not None:
            row.role = role
    s.flush()
    if workspace is not None and workspace not in roles:
        raise ApiError(403, "FORBIDDEN", f"Signed in as {who}, but your groups give you no role in workspace "
                                         f"{workspace}; they give: {', '.join(f'{w} ({r})' for w, r in roles.items())}")
    ws_name = workspace or next(iter(roles))
    tok, secret = create_token(s, org, "user", by_name[ws_name], roles[ws_name], expires_in=expires_in, user=u)
    return {"id": tok.id, "kind": "user", "role": roles[ws_name], "workspace": ws_name, "user": u.name,
            "token": secret, "token_row": tok}


def _org(s: Session, org_name: str) -> tuple[Org, SsoProvider]:
    org = s.scalar(select(Org).where(Org.name == org_name))
    p = provider_of(s, org) if org is not None else None
    if p is None:
        raise ApiError(404, "NOT_FOUND", f"organisation {org_name} has no single sign-on: an admin sets it up with "
                                         "PUT $ORG_API/sso")
    return org, p


def cli_client(s: Session, org_name: str) -> dict:
    """What `astra login --sso` needs to start the device flow: the issuer and the CLI's client id."""
    _org_row, p = _org(s, org_name)
    if not p.cli_client_id:
        raise ApiError(404, "NOT_FOUND", f"organisation {org_name}'s single sign-on has no client for astra: an admin "
                                         "sets cli_client_id (PUT $ORG_API/sso)")
    return {"issuer": p.issuer, "client_id": p.cli_client_id, "scope": SCOPES}


def token_for_id_token(s: Session, org_name: str, body: dict) -> dict:
    """An ID token the CLI got by the device flow → a token of its user (`POST $ORG_API/sso/token`)."""
    id_token = body.get("id_token") if isinstance(body, dict) else None
    if not isinstance(id_token, str) or id_token.count(".") != 2:
        raise ApiError(422, "INVALID", "id_token: give the ID token the provider issued to astra (a JWT)")
    workspace = body.get("workspace")
    if workspace is not None and not isinstance(workspace, str):
        raise ApiError(422, "INVALID", "workspace: give a workspace name")
    org, p = _org(s, org_name)
    if unverified_issuer(id_token) != p.issuer:  # before any request to the provider on a stranger's behalf
        raise ApiError(401, "UNAUTHENTICATED", f"the ID token was not issued by this organisation's provider "
                                               f"({p.issuer}): sign in with astra login --sso")
    claims = verify_id_token(p, discover(p.issuer), id_token, [a for a in (p.cli_client_id, p.client_id) if a], None)
    out = sign_in(s, org, p, claims, workspace, None)
    out.pop("token_row")
    return out


def begin_console_sign_in(s: Session, org_name: str, nxt: str, redirect_uri: str) -> str:
    """Where to send the browser: the provider's authorization endpoint, with a fresh state, nonce and PKCE
    challenge (the verifier stays here, in sso_logins)."""
    org, p = _org(s, org_name)
    doc = discover(p.issuer)
    state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
    client = OAuth2Client(p.client_id, p.client_secret, scope=SCOPES, redirect_uri=redirect_uri,
                          code_challenge_method="S256")
    url, _ = client.create_authorization_url(doc["authorization_endpoint"], state=state, nonce=nonce,
                                             code_verifier=verifier)
    now = time.time()
    for old in s.scalars(select(SsoLogin).where(SsoLogin.expires_at < now)):
        s.delete(old)
    s.add(SsoLogin(state=digest(state), org_id=org.id, verifier=verifier, nonce=nonce, next=nxt,
                   expires_at=now + LOGIN_SECONDS))
    s.flush()
    return url


def finish_console_sign_in(s: Session, state: str, code: str, redirect_uri: str, hours: float) -> tuple[dict, str]:
    """The provider's callback: the code exchanged (with the PKCE verifier), the ID token checked, the user signed
    in. Returns the token issued (with `token_row`) and where to go next."""
    login = s.scalar(select(SsoLogin).where(SsoLogin.state == digest(state or "")))
    if login is None or login.expires_at < time.time():
        raise ApiError(400, "INVALID", "this sign-in is unknown or took too long: start again from the sign-in page")
    s.delete(login)
    org = s.get(Org, login.org_id)
    _org_row, p = _org(s, org.name)
    doc = discover(p.issuer)
    client = OAuth2Client(p.client_id, p.client_secret, redirect_uri=redirect_uri)
    try:
        tokens = client.fetch_token(doc["token_endpoint"], grant_type="authorization_code", code=code,
                                    code_verifier=login.verifier, timeout=PROVIDER_TIMEOUT)
    except Exception as e:  # Authlib's OAuthError or the transport's: the provider refused or did not answer
        raise ApiError(401, "UNAUTHENTICATED", f"the provider did not give a token for this sign-in ({e}): start "
                                               "again from the sign-in page") from None
    if "id_token" not in tokens:
        raise ApiError(401, "UNAUTHENTICATED", "the provider gave no ID token: ask an admin to allow the openid scope "
                                               "for the console's client")
    claims = verify_id_token(p, doc, tokens["id_token"], [p.client_id], login.nonce)
    return sign_in(s, org, p, claims, None, hours * 3600), login.next


def end_session_url(s: Session, cs: ConsoleSession | None, signed_out: str) -> str | None:
    """Where sign-out sends a person who signed in by single sign-on: the provider's end_session_endpoint (which
    comes back to `signed_out`); None for a token's session, or when the provider offers none or does not answer."""
    tok = s.get(Token, cs.token_id) if cs is not None else None
    u = s.get(User, tok.user_id) if tok is not None and tok.user_id is not None else None
    p = s.scalar(select(SsoProvider).where(SsoProvider.org_id == u.org_id)) if u and u.sso_subject else None
    if p is None:
        return None
    try:
        end = discover(p.issuer).get("end_session_endpoint")
    except ApiError:
        return None  # the console session is over either way
    if not end:
        return None
    return f"{end}?{urlencode({'client_id': p.client_id, 'post_logout_redirect_uri': signed_out})}"
