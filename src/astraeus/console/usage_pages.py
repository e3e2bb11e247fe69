"""The console's Usage page (GPU-hours per workspace and per user per day, the cluster's GPUs in use over time, the
queue-wait distribution) and the machines page's sparklines: the usage records read through
`astraeus.server.services.usage`, added up by `astraeus.usage.aggregate` (as GET $API/usage), drawn by `charts`.
A workspace's members see their workspace; organisation admins the organisation, by workspace (docs/usage.md)."""

from __future__ import annotations

import math
import time

from fastapi import Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import usage as U
from astraeus.console import charts
from astraeus.console.base import Page, cp_of, page, render, router, ws_page
from astraeus.server import services
from astraeus.server.db import Cluster
from astraeus.server.services import usage as usage_service

SINCE_CHOICES = ("7d", "30d")  # the page's selector; any `since` GET $API/usage takes works too
SPARK_WINDOW = 86400.0  # a machine's sparkline: its GPUs in use over the last 24 h
# Queue-wait buckets: each bucket's upper bound in seconds (as the Prometheus histogram's) and its label.
WAIT_BUCKETS = ((1, "< 1 s"), (5, "1–5 s"), (15, "5–15 s"), (60, "15 s–1 min"), (300, "1–5 min"),
                (900, "5–15 min"), (3600, "15 min–1 h"), (4 * 3600, "1–4 h"), (86400, "4 h–1 d"),
                (math.inf, "> 1 d"))
NO_USER = "(no user)"  # a run from before users existed


# ----------------------------------------------------------------------------------- pure: the figures


def days(lo: float, hi: float) -> list[str]:
    """The UTC days [lo, hi) touches, in order (the bars' categories)."""
    out, t = [], lo
    while t < hi:
        out.append(U.day_of(t))
        t = (math.floor(t / 86400) + 1) * 86400
    return out


def per_day(items: list[dict], key: str, categories: list[str]) -> list[charts.Series]:
    """GET $API/usage's lines grouped by (`key`, day) → one series per `key` value, its GPU-hours per day."""
    names = sorted({it[key] or NO_USER for it in items})
    at = {d: i for i, d in enumerate(categories)}
    series = {n: [0.0] * len(categories) for n in names}
    for it in items:
        if it["day"] in at:
            series[it[key] or NO_USER][at[it["day"]]] += it["gpu_hours"]
    return [charts.Series(n, series[n]) for n in names]


def wait_histogram(attempts: list[U.Attempt], lo: float, hi: float) -> list[tuple[str, int]]:
    """How many attempts (those the report counts: started in the window, or running into it) waited how long."""
    counts = [0] * len(WAIT_BUCKETS)
    for a in attempts:
        end = a.end if a.end is not None else hi
        if not (a.start < hi and (end > lo or a.start >= lo)):
            continue
        counts[next(i for i, (top, _) in enumerate(WAIT_BUCKETS) if a.wait_seconds < top)] += 1
    return [(name, n) for (_, name), n in zip(WAIT_BUCKETS, counts, strict=True)]


def in_use(attempts: list[U.Attempt], lo: float, hi: float, now: float) -> list[tuple[float, float]]:
    """GPUs in use over [lo, hi): the attempts' GPUs from placement to end (a running one until now)."""
    return charts.step_series([(a.start, a.end if a.end is not None else now, a.gpus) for a in attempts], lo, hi)


# ------------------------------------------------------------------------------------------ the page


def gpus_present(s: Session, p: Page) -> int:
    """The GPUs of the Ready machines of the clusters the page covers (the workspace's, or the organisation's)."""
    if p.org_admin:
        ids = list(s.scalars(select(Cluster.id).where(Cluster.org_id == p.org.id)))
    else:
        ids = services.granted_cluster_ids(s, p.caller)
    return sum(m.gpus for m in services.list_machines(s, ids) if m.state == "Ready")


def usage_ctx(s: Session, p: Page, since: str, now: float) -> dict:
    scope = None if p.org_admin else p.ws
    lo, hi, attempts = usage_service.attempts(s, p.org, scope, since, None, now)
    cats = days(lo, hi)
    short = {d: d[5:] for d in cats}  # 2026-12-06 → 12-06 on the axis
    who = f"organisation {p.org.name}" if scope is None else f"workspace {p.ws.name}"
    by_ws, ws_total = U.aggregate(attempts, ("workspace", "day"), lo, hi, now)
    by_user, _ = U.aggregate(attempts, ("user", "day"), lo, hi, now)
    present = gpus_present(s, p)
    steps = in_use(attempts, lo, hi, now)
    util = [{**d, "gpu_hours": d["amount_seconds"] / 3600,
             "percent": 100 * d["average"] / present if present else None} for d in charts.daily(steps, lo, hi)]
    waits = wait_histogram(attempts, lo, hi)
    ws_series, user_series = per_day(by_ws, "workspace", cats), per_day(by_user, "user", cats)
    span = f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(lo))} – {time.strftime('%Y-%m-%d %H:%M', time.gmtime(hi))} UTC"
    return {
        "figure": charts.figure, "since": since, "span": span, "who": who, "org_scope": scope is None, "present": present,
        "total": ws_total, "by_ws": [x for x in by_ws if x["attempts"] or x["gpu_seconds"]],
        "by_user": [x for x in by_user if x["attempts"] or x["gpu_seconds"]], "util": util, "waits": waits,
        "ws_chart": charts.stacked_bars("chart-workspaces", "GPU-hours per workspace per day",
                                        f"GPU-hours used by each workspace of the {who}, per UTC day, stacked; "
                                        f"{span}.", cats, ws_series, "GPU-hours", short),
        "ws_legend": charts.legend([x.name for x in ws_series]) if any(sum(x.values) for x in ws_series) else "",
        "user_chart": charts.stacked_bars("chart-users", "GPU-hours per user per day",
                                          f"GPU-hours used by each user in the {who}, per UTC day, stacked; {span}.",
                                          cats, user_series, "GPU-hours", short),
        "user_legend": charts.legend([x.name for x in user_series]) if any(sum(x.values) for x in user_series) else "",
        "util_chart": charts.area("chart-utilisation", "GPUs in use over time",
                                  f"GPUs held by the {who}'s workers over time, against the {present} GPUs of the "
                                  f"Ready machines (dashed); {span}.", steps, lo, hi, present),
        "wait_chart": charts.histogram("chart-queue-wait", "Queue wait",
                                       f"How many worker attempts waited in the queue how long before being placed, "
                                       f"in the {who}; {span}.", [n for n, _ in waits], [c for _, c in waits]),
    }


@router.get("/o/{org}/w/{ws}/usage")
@page
def usage(request: Request, org: str, ws: str, since: str = "7d"):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "usage.html", p, nav="usage", choices=SINCE_CHOICES,
                      **usage_ctx(s, p, since.strip() or "7d", time.time()))


# ------------------------------------------------------------------------------ the machines' sparklines


def machine_sparks(s: Session, machines: list[dict], now: float) -> dict[tuple[str, str], str]:
    """Each machine's sparkline (keyed by its cluster and name): its GPUs in use over the last 24 h."""
    names = dict(s.execute(select(Cluster.id, Cluster.name)).all())
    rows = services.list_machines(s, list({cid for cid, n in names.items() if n in {m["cluster"] for m in machines}}))
    ids = {(names[m.cluster_id], m.name): m for m in rows}
    lo = now - SPARK_WINDOW
    held = usage_service.machine_intervals(s, [m.id for m in ids.values()], lo, now)
    out = {}
    for m in machines:
        row = ids.get((m["cluster"], m["name"]))
        if row is None:
            continue
        steps = charts.step_series(held.get(row.id, []), lo, now)
        peak = max(v for _, v in steps)
        out[(m["cluster"], m["name"])] = charts.sparkline(
            f"spark-{m['cluster']}-{m['name']}",
            f"{m['name']}: GPUs in use over the last 24 h (at most {peak:g} of {row.gpus}; "
            f"now {steps[-1][1]:g})", steps, lo, now, row.gpus)
    return out
