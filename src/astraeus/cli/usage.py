"""`astra astraeus usage` and `astra slurm sreport`: GPU-hours from the usage records of worker attempts
($API/usage; docs/usage.md).

sreport prints Slurm's layouts (`cluster AccountUtilizationByUser`, `user TopUsage`) with the one TRES Astraeus
accounts, gres/gpu: the account is the workspace, the login the run's user (the workspace when the run has none).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from astraeus.cli import format as fmt
from astraeus.cli import slurm_views as sv
from astraeus.cli.client import Client
from astraeus.cli.errors import ViewError

BY_HELP = "Group by workspace, user, run, gpu_model, day or cluster (repeat, or comma-separate)"


def _client(every: bool) -> Client:
    return Client.org_from_env() if every else Client.from_env()


def usage_table(data: dict[str, Any]) -> str:
    """The usage answer as a table: the groups' keys, then GPU-HOURS, ATTEMPTS, PREEMPTED and QUEUE WAIT (their
    total), and a TOTAL line."""
    groups = list(data.get("group_by") or [])
    headers = [g.upper().replace("_", " ") for g in groups] + ["GPU-HOURS", "ATTEMPTS", "PREEMPTED", "QUEUE WAIT"]

    def nums(r: dict) -> list[str]:
        return [f"{r['gpu_hours']:.2f}", str(r["attempts"]), str(r["preemptions"]),
                fmt.human_duration(r["queue_wait_seconds"]) or "0s"]

    rows = [[str(r.get(g) if r.get(g) is not None else "-") for g in groups] + nums(r) for r in data["items"]]
    if groups:
        rows.append(["TOTAL"] + [""] * (len(groups) - 1) + nums(data["total"]))
    else:
        rows = [nums(data["total"])]
    head = f"Usage {data['since']} - {data['until']}\n"
    return head + fmt.table(headers, rows)


# --- sreport -----------------------------------------------------------------------------------------------------

RULE = "-" * 80
UNITS = {"minutes": ("Minutes", 60), "hours": ("Hours", 3600), "seconds": ("Seconds", 1)}
# Slurm's column widths (right-aligned, each followed by a space)
WIDTH = {"Cluster": 9, "Account": 15, "Login": 9, "Proper Name": 15, "TRES Name": 14, "Used": 10}
REPORTS = {("cluster", "accountutilizationbyuser"): "AccountUtilizationByUser", ("user", "topusage"): "TopUsage"}


def sreport_lines(headers: list[str], rows: list[list[str]], parsable: str | None, header: bool) -> list[str]:
    """Slurm's print_fields: right-aligned columns, or `|`-separated with -P (parsable2) and -p (a trailing |)."""
    if parsable:
        end = "|" if parsable == "p" else ""
        lines = [r for r in ([headers] if header else []) + rows]
        return ["|".join(r) + end for r in lines]
    out = []
    if header:
        out.append("".join(f"{h:>{WIDTH[h]}} " for h in headers))
        out.append("".join("-" * WIDTH[h] + " " for h in headers))
    out += ["".join(f"{fmt.terminal_safe(c)[:WIDTH[h]]:>{WIDTH[h]}} " for h, c in zip(headers, r, strict=True))
            for r in rows]
    return out


def used(gpu_seconds: float, per: int) -> str:
    return str(math.floor(gpu_seconds / per + 1e-9))


def account_by_user(data: dict[str, Any], per: int) -> list[list[str]]:
    """`cluster AccountUtilizationByUser` from usage grouped by cluster, workspace and user: per cluster its root
    (the whole cluster), then each account (workspace) followed by its logins."""
    rows: list[list[str]] = []
    items = data["items"]
    for cl in sorted({r["cluster"] for r in items}):
        mine = [r for r in items if r["cluster"] == cl]
        rows.append([cl, "root", "", "", "gres/gpu", used(sum(r["gpu_seconds"] for r in mine), per)])
        for ws in sorted({r["workspace"] for r in mine}):
            users = [r for r in mine if r["workspace"] == ws]
            rows.append([cl, ws, "", "", "gres/gpu", used(sum(r["gpu_seconds"] for r in users), per)])
            rows += [[cl, ws, r["user"] or ws, "", "gres/gpu", used(r["gpu_seconds"], per)] for r in users]
    return rows


def top_usage(data: dict[str, Any], per: int, top: int) -> list[list[str]]:
    """`user TopUsage`: one line per login and account, most used first, the top `top`."""
    items = sorted(data["items"], key=lambda r: (-r["gpu_seconds"], r["user"] or r["workspace"], r["workspace"]))
    return [[r["cluster"], r["user"] or r["workspace"], "", r["workspace"], "gres/gpu", used(r["gpu_seconds"], per)]
            for r in items[:top]]


def sreport_window(start: str | None, end: str | None, now: datetime) -> tuple[datetime, datetime]:
    """Slurm's defaults: from yesterday's midnight to today's (local time); a start given after today's midnight
    ends now."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    lo = sv.parse_when(start, now, "start", "sreport") if start else midnight - timedelta(days=1)
    hi = sv.parse_when(end, now, "end", "sreport") if end else midnight if lo < midnight else now
    if hi <= lo:
        raise ViewError(f"sreport: error: start={start or 'yesterday'} is not before end={end or 'today'}: give an "
                        "end after the start")
    return lo, hi


def parse_words(words: list[str]) -> tuple[str, dict[str, str]]:
    """`cluster AccountUtilizationByUser start=… end=…` → the report's name and its KEY=VALUE options (lower-case
    keys)."""
    plain = [w for w in words if "=" not in w]
    opts = {k.lower(): v for k, _, v in (w.partition("=") for w in words if "=" in w)}
    known = "'cluster AccountUtilizationByUser' or 'user TopUsage'"
    if len(plain) != 2 or (plain[0].lower(), plain[1].lower()) not in REPORTS:
        raise ViewError(f"sreport: error: unknown report {' '.join(plain) or '(none)'!r}: give {known}, e.g. "
                        "astra slurm sreport cluster AccountUtilizationByUser start=2026-12-01 end=now")
    bad = sorted(set(opts) - {"start", "end", "topcount"})
    if bad:
        raise ViewError(f"sreport: error: unknown option {bad[0]}=: use start=, end= (and TopCount= for TopUsage)")
    return REPORTS[(plain[0].lower(), plain[1].lower())], opts


def register(astraeus_app: typer.Typer, slurm_app: typer.Typer, guard, view_errors, view_context: dict) -> None:
    """Add `usage` to `astra astraeus` and `sreport` to `astra slurm` (`guard`: astra's one-line error handling)."""

    @astraeus_app.command("usage")
    @guard()
    def usage(
        by: Annotated[list[str] | None, typer.Option("--by", help=BY_HELP)] = None,
        since: Annotated[str, typer.Option("--since", help="7d, 12h, 2030-01-01, 2030-01-01T12:00:00Z")] = "7d",
        until: Annotated[str | None, typer.Option("--until", help="As --since; default now")] = None,
        every: Annotated[bool, typer.Option("--all", help="Every workspace of the organisation (organisation "
                                                          "admins: ASTRAEUS_ADMIN_TOKEN, or an admin's token)")]
        = False,
        output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
    ) -> None:
        """GPU-hours, attempts, preemptions and queue wait of your workspace's runs, grouped (docs/usage.md)."""
        from astraeus.cli.commands import check_output, print_json

        as_json = check_output(output)
        params: dict[str, Any] = {"group_by": list(by or []), "since": since}
        if until:
            params["until"] = until
        with _client(every) as c:
            data = c.get("usage", **params)
        if as_json:
            print_json(data)
        else:
            typer.echo(usage_table(data), nl=False)

    @slurm_app.command("sreport", context_settings=view_context)
    @guard(prefix="sreport: error: ")
    @view_errors
    def sreport(
        ctx: typer.Context,
        parsable2: Annotated[bool, typer.Option("-P", "--parsable2", help="'|'-separated, no trailing '|'")] = False,
        parsable: Annotated[bool, typer.Option("-p", "--parsable", help="'|'-separated, a trailing '|'")] = False,
        noheader: Annotated[bool, typer.Option("-n", "--noheader", help="No header lines")] = False,
        time_format: Annotated[str, typer.Option("-t", help="Minutes (default), Hours or Seconds")] = "Minutes",
        tres: Annotated[str, typer.Option("-T", "--tres", help="gres/gpu (the one TRES Astraeus accounts)")]
        = "gres/gpu",
        every: Annotated[bool, typer.Option("--all", help="Every workspace (organisation admins)")] = False,
    ) -> None:
        """Slurm's usage reports: `cluster AccountUtilizationByUser` and `user TopUsage` (start=, end=,
        TopCount=), in GPU (gres/gpu) minutes; the account is the workspace, the login the run's user."""
        words = list(ctx.args)
        unknown = [w for w in words if w.startswith("-")]
        if unknown:
            raise ViewError(f"sreport: error: unrecognized option {unknown[0]!r} (astra slurm sreport --help lists "
                            "the options)")
        report, opts = parse_words(words)
        if time_format.lower() not in UNITS:
            raise ViewError(f"sreport: error: -t {time_format}: give Minutes, Hours or Seconds")
        if tres.lower() not in ("gres/gpu", "gpu"):
            raise ViewError(f"sreport: error: -T {tres}: Astraeus accounts GPUs only: give -T gres/gpu")
        top = opts.get("topcount", "10")
        if not top.isdigit() or int(top) < 1:
            raise ViewError(f"sreport: error: TopCount={top}: give a whole number of users, e.g. TopCount=10")
        unit, per = UNITS[time_format.lower()]
        now = datetime.now().astimezone()
        lo, hi = sreport_window(opts.get("start"), opts.get("end"), now)
        with _client(every) as c:
            data = c.get("usage", group_by=["cluster", "workspace", "user"], since=str(lo.timestamp()),
                         until=str(hi.timestamp()))
        span = f"{lo.strftime('%Y-%m-%dT%H:%M:%S')} - {(hi - timedelta(seconds=1)).strftime('%Y-%m-%dT%H:%M:%S')}"
        secs = int((hi - lo).total_seconds())
        if report == "AccountUtilizationByUser":
            title = f"Cluster/Account/User Utilization {span} ({secs} secs)"
            headers = ["Cluster", "Account", "Login", "Proper Name", "TRES Name", "Used"]
            rows = account_by_user(data, per)
        else:
            title = f"Top {top} Users {span} ({secs} secs)"
            headers = ["Cluster", "Login", "Proper Name", "Account", "TRES Name", "Used"]
            rows = top_usage(data, per, int(top))
        lines = [RULE, title, f"Usage reported in TRES {unit}", RULE] if not noheader else []
        lines += sreport_lines(headers, rows, "P" if parsable2 else "p" if parsable else None, not noheader)
        typer.echo("\n".join(lines) + "\n" if lines else "", nl=False)
