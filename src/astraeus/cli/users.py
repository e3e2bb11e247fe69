"""`astra astraeus audit` and `astra astraeus users`: the organisation's audit log and its users (docs/users.md).
Organisation admins: ASTRAEUS_ADMIN_TOKEN, or an org admin's token."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from astraeus.cli import format as fmt
from astraeus.cli.client import Client


def audit_table(items: list[dict[str, Any]]) -> str:
    """TIME USER WORKSPACE ACTION OBJECT STATUS FROM, oldest first; a refused change reads `403 refused`."""
    rows = [[e.get("time") or "", e.get("user") or "-", e.get("workspace") or "-", e.get("action") or "",
             e.get("object") or "", f"{e.get('status')}" + ("" if e.get("allowed") else " refused"),
             e.get("address") or ""] for e in items]
    return fmt.table(["TIME", "USER", "WORKSPACE", "ACTION", "OBJECT", "STATUS", "FROM"], rows)


def users_table(items: list[dict[str, Any]]) -> str:
    rows = [[u["name"], u.get("display_name") or "", u.get("email") or "", "yes" if u.get("org_admin") else "",
             ", ".join(f"{ws}={role}" for ws, role in (u.get("roles") or {}).items())] for u in items]
    return fmt.table(["NAME", "DISPLAY NAME", "EMAIL", "ORG ADMIN", "ROLES"], rows)


def parse_roles(roles: list[str]) -> dict[str, str]:
    """`--role vision=editor` (repeated) as {workspace: role}; the API checks the role's name."""
    out = {}
    for r in roles:
        ws, sep, role = r.partition("=")
        if not sep or not ws or not role:
            raise typer.BadParameter(f"{r!r}: give WORKSPACE=ROLE (vision=editor)", param_hint="--role")
        out[ws] = role
    return out


def register(astraeus_app: typer.Typer, guard) -> None:
    """Add `audit` and `users` to `astra astraeus` (`guard`: astra's one-line error handling)."""

    @astraeus_app.command("audit")
    @guard()
    def audit(
        since: Annotated[str, typer.Option("--since", help="7d, 12h, 30m, epoch seconds or 2030-01-01T00:00:00Z")]
        = "7d",
        user: Annotated[str | None, typer.Option("--user", help="Only this user's changes")] = None,
        workspace: Annotated[str | None, typer.Option("--workspace", help="Only changes in this workspace")] = None,
        limit: Annotated[int, typer.Option("--limit", help="The most entries shown (1-10000)", min=1, max=10000)]
        = 1000,
        output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
    ) -> None:
        """Who changed what, when, from where, allowed or refused (oldest first)."""
        from astraeus.cli.commands import check_output, print_json

        as_json = check_output(output)
        params: dict[str, Any] = {"since": since, "limit": min(limit, 1000)}
        if user:
            params["user"] = user
        if workspace:
            params["workspace"] = workspace
        items: list = []
        with Client.org_from_env() as c:
            while True:
                page = c.get("audit", **params)
                items += page["items"]
                if not page.get("next_cursor") or len(items) >= limit:
                    break
                params["cursor"] = page["next_cursor"]
        items = items[:limit]
        if as_json:
            print_json({"items": items})
        else:
            typer.echo(audit_table(items), nl=False)

    @astraeus_app.command("users")
    @guard()
    def users(
        action: Annotated[str | None, typer.Argument(metavar="[create|delete|token]")] = None,
        name: Annotated[str | None, typer.Argument(metavar="[NAME]", help="alice, or service:NAME")] = None,
        role: Annotated[list[str] | None, typer.Option("--role", help="create: WORKSPACE=ROLE (repeat); token: "
                                                                      "the token's role")] = None,
        org_admin: Annotated[bool, typer.Option("--org-admin", help="create: an organisation admin")] = False,
        email: Annotated[str | None, typer.Option("--email")] = None,
        workspace: Annotated[str | None, typer.Option("--workspace", help="token: the workspace it acts in")]
        = None,
        output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
    ) -> None:
        """The organisation's users; create one, delete one, or make a token of one (shown once)."""
        from astraeus.cli.commands import check_output, print_json

        as_json = check_output(output)
        if action is not None and action not in ("create", "delete", "token"):
            raise typer.BadParameter(f"{action!r}: give create, delete or token (or nothing to list)")
        if action is not None and not name:
            raise typer.BadParameter(f"users {action}: name the user (astra astraeus users {action} NAME)")
        with Client.org_from_env() as c:
            if action is None:
                data = c.get("users")
                print_json(data) if as_json else typer.echo(users_table(data["items"]), nl=False)
            elif action == "create":
                body: dict[str, Any] = {"name": name, "roles": parse_roles(role or []), "org_admin": org_admin}
                if email:
                    body["email"] = email
                data = c.post("users", body)
                print_json(data) if as_json else typer.echo(users_table([data]), nl=False)
            elif action == "delete":
                c.delete(f"users/{name}")
                typer.echo(f"user {name} deleted; its tokens no longer work")
            else:
                body = {"workspace": workspace} if workspace else {"kind": "org_admin"}
                if role:
                    body["role"] = role[0]
                data = c.post(f"users/{name}/tokens", body)
                print_json(data) if as_json else typer.echo(data["token"])
