"""What a simulation shows: waits per priority class beside the production scheduler's, GPU utilisation over
time, preemptions and the work they cost, makespan, and the scheduler's own time per cycle."""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from typing import Any

from astraeus.sim.engine import SimResult


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of unsorted values; None when there are none."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def _dist(values: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": (sum(values) / len(values)) if values else None,
    }


def utilisation(series: list[tuple[float, int]], total_gpus: int, start: float, end: float) -> float:
    """Time-weighted mean fraction of GPUs held by workers over [start, end]."""
    if end <= start or total_gpus <= 0 or not series:
        return 0.0
    area = 0.0
    for i, (t, busy) in enumerate(series):
        t_next = series[i + 1][0] if i + 1 < len(series) else end
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            area += busy * (hi - lo)
    return area / ((end - start) * total_gpus)


def recorded_busy_series(result: SimResult) -> list[tuple[float, int]]:
    """GPUs held over time by the same tasks as the production scheduler ran them (scheduled → deleted)."""
    deltas: dict[float, int] = defaultdict(int)
    for st in result.states.values():
        t = st.task
        if t.recorded_wait is None or t.gpus == 0:
            continue
        begin = t.submit_time + t.recorded_wait
        deltas[begin] += t.gpus
        deltas[begin + t.duration] -= t.gpus
    series: list[tuple[float, int]] = []
    busy = 0
    for when in sorted(deltas):
        busy += deltas[when]
        series.append((when, busy))
    return series


def build_report(result: SimResult) -> dict[str, Any]:
    states = list(result.states.values())
    by_class: dict[str, list[float]] = defaultdict(list)
    recorded: dict[str, list[float]] = defaultdict(list)
    queued: dict[str, list[float]] = defaultdict(list)
    priorities: dict[str, int] = {}
    for st in states:
        t = st.task
        cls = t.priority_class or f"priority {t.priority}"
        priorities[cls] = t.priority
        if st.first_start is not None:
            by_class[cls].append(st.first_start - t.submit_time)
            queued[cls].append(st.queued_seconds)
        if t.recorded_wait is not None:
            recorded[cls].append(t.recorded_wait)
    classes = sorted(priorities, key=lambda c: -priorities[c])
    outcomes = Counter(st.outcome for st in states)
    start, end = result.start_time, result.end_time
    plan_ms = [s * 1000.0 for s in result.plan_seconds]
    trace = result.trace
    report: dict[str, Any] = {
        "trace": {
            "format": trace.fmt,
            "tasks": len(states),
            "machines": len(trace.machines),
            "gpus": result.total_gpus,
            "skipped_unknown_duration": trace.skipped_unknown_duration,
            "shared_gpu_as_whole": trace.shared_gpu_as_whole,
            "limit": trace.limited_to,
            "notes": list(trace.notes),
        },
        "options": {
            "backfill": result.options.backfill,
            "preemption": result.options.preemption,
            "fifo": result.options.fifo,
            "fair_share": result.options.fair_share,
            "checkpoint_interval": result.options.checkpoint_interval,
        },
        "outcomes": dict(outcomes),
        "waits": {
            cls: {
                "priority": priorities[cls],
                "simulated": _dist(by_class[cls]),
                "queued_total": _dist(queued[cls]),
                "recorded": _dist(recorded[cls]) if recorded[cls] else None,
            }
            for cls in classes
        },
        "utilisation": utilisation(result.busy_series, result.total_gpus, start, end),
        # 200 samples of the fraction of GPUs held, [time, fraction], for plotting elsewhere.
        "utilisation_series": [
            [x, y / result.total_gpus if result.total_gpus else 0.0]
            for x, y in zip(*_step_points(result.busy_series, start, end, 200), strict=True)
        ] if result.busy_series and end > start else [],
        "peak_gpus_busy": max((b for _, b in result.busy_series), default=0),
        "preemptions": result.preemptions,
        "preempted_tasks": sum(1 for st in states if st.preemptions),
        "gpu_hours_lost": result.lost_gpu_seconds / 3600.0,
        "gpu_hours_in_stop_grace": result.grace_gpu_seconds / 3600.0,
        "gpu_hours_done": sum(st.task.gpus * (st.task.duration - st.remaining) for st in states) / 3600.0,
        "backfilled_starts": result.backfilled_starts,
        "makespan_seconds": end - start,
        "start_time": start,
        "end_time": end,
        "scheduler": {
            "plans": result.plans,
            "event_times": result.event_times,
            "p50_ms": percentile(plan_ms, 50),
            "p99_ms": percentile(plan_ms, 99),
            "max_ms": max(plan_ms, default=None),
            "total_s": sum(result.plan_seconds),
        },
        "wall_seconds": result.wall_seconds,
        "invalid_placements": result.invalid_placements,
        "invalid_examples": list(result.invalid_examples),
        "never_started": len(result.never_started_reasons),
        "never_started_reasons": dict(Counter(result.never_started_reasons.values()).most_common(5)),
    }
    if trace.comparable_to_production and any(st.task.recorded_wait is not None for st in states):
        rec = recorded_busy_series(result)
        rec_end = max((when for when, _ in rec), default=start)
        report["recorded_utilisation"] = utilisation(rec, result.total_gpus, start, rec_end)
        report["recorded_makespan_seconds"] = rec_end - start
    return report


def _fmt_s(v: float | int | None) -> str:
    if v is None:
        return "-"
    if v < 120:
        return f"{v:.0f}s"
    if v < 7200:
        return f"{v / 60:.1f}m"
    if v < 172800:
        return f"{v / 3600:.1f}h"
    return f"{v / 86400:.1f}d"


def format_report(report: dict[str, Any]) -> str:
    tr, opt, sch = report["trace"], report["options"], report["scheduler"]
    rules = [
        f"backfill {'on' if opt['backfill'] else 'OFF'}",
        f"preemption {'on' if opt['preemption'] else 'OFF'}",
        "FIFO" if opt["fifo"] else "priority order",
        f"fair share {'on' if opt['fair_share'] else 'OFF'}",
        f"checkpoint every {opt['checkpoint_interval']:g}s" if opt["checkpoint_interval"] else "no checkpoints",
    ]
    lines = [
        f"Simulated {tr['tasks']} tasks on {tr['machines']} machines ({tr['gpus']} GPUs), format {tr['format']}"
        + (f", first {tr['limit']} rows" if tr["limit"] else ""),
        "Rules: " + ", ".join(rules),
    ]
    lines += [f"  - {n}" for n in tr["notes"]]
    lines.append("")
    lines.append("Waits (submit → first start) per priority class; production = the recorded scheduled − creation")
    lines.append(f"  {'class':<14}{'prio':>6}{'tasks':>7}   {'p50':>7}{'p95':>8}{'p99':>8}   "
                 f"{'prod p50':>9}{'prod p95':>9}{'prod p99':>9}")
    for cls, w in report["waits"].items():
        s, r = w["simulated"], w["recorded"] or {}
        lines.append(
            f"  {cls:<14}{w['priority']:>6}{s['n']:>7}   {_fmt_s(s['p50']):>7}{_fmt_s(s['p95']):>8}"
            f"{_fmt_s(s['p99']):>8}   {_fmt_s(r.get('p50')):>9}{_fmt_s(r.get('p95')):>9}{_fmt_s(r.get('p99')):>9}"
        )
    lines.append("")
    util = f"GPU utilisation: {report['utilisation'] * 100:.1f}% mean (peak {report['peak_gpus_busy']} of {tr['gpus']})"
    if "recorded_utilisation" in report:
        util += f"; production {report['recorded_utilisation'] * 100:.1f}% (same tasks, whole GPUs)"
    lines.append(util)
    lines.append(
        f"Preemptions: {report['preemptions']} ({report['preempted_tasks']} tasks); GPU-hours lost to preemption: "
        f"{report['gpu_hours_lost']:.2f} (+{report['gpu_hours_in_stop_grace']:.2f} held in stop grace) of "
        f"{report['gpu_hours_done']:.1f} done"
    )
    lines.append(f"Backfilled starts: {report['backfilled_starts']}")
    mk = f"Makespan: {_fmt_s(report['makespan_seconds'])} ({report['makespan_seconds']:.0f}s)"
    if "recorded_makespan_seconds" in report:
        mk += f"; production {_fmt_s(report['recorded_makespan_seconds'])}"
    lines.append(mk)
    lines.append("Outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(report["outcomes"].items())))
    if report["never_started"]:
        lines.append(f"Never started: {report['never_started']}; reasons: {report['never_started_reasons']}")
    if report["invalid_placements"]:
        lines.append(f"INVALID placements from the scheduler (not applied): {report['invalid_placements']}: "
                     f"{report['invalid_examples']}")
    p50, p99 = sch["p50_ms"], sch["p99_ms"]
    lines.append(
        f"Scheduler: {sch['plans']} plans over {sch['event_times']} event times; per cycle p50 "
        f"{p50 if p50 is None else f'{p50:.2f}'} ms, p99 {p99 if p99 is None else f'{p99:.2f}'} ms; "
        f"{sch['total_s']:.1f}s in plan() of {report['wall_seconds']:.1f}s wall"
    )
    return "\n".join(lines)


def _step_points(series: list[tuple[float, int]], start: float, end: float, points: int = 2000):
    """Samples of a step function at `points` evenly spaced times (keeps the plot light for any trace)."""
    times = [t for t, _ in series]
    xs, ys = [], []
    for i in range(points + 1):
        x = start + (end - start) * i / points
        k = bisect.bisect_right(times, x) - 1
        xs.append(x)
        ys.append(series[k][1] if k >= 0 else 0)
    return xs, ys


def plot_utilisation(result: SimResult, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, end = result.start_time, result.end_time
    fig, ax = plt.subplots(figsize=(10, 4))
    top = 0.0
    if end > start:
        scale, unit = (86400.0, "days") if end - start > 3 * 86400 else (3600.0, "hours")
        if end - start < 3 * 3600:
            scale, unit = 1.0, "seconds"
        xs, ys = _step_points(result.busy_series, start, end)
        pct = [100.0 * y / result.total_gpus for y in ys]
        top = max(pct, default=0.0)
        ax.plot([(x - start) / scale for x in xs], pct, drawstyle="steps-post", label="Astraeus (simulated)")
        rec = recorded_busy_series(result) if result.trace.comparable_to_production else []
        if rec:
            xs, ys = _step_points(rec, start, end)
            pct = [100.0 * y / result.total_gpus for y in ys]
            top = max(top, max(pct, default=0.0))
            ax.plot([(x - start) / scale for x in xs], pct, drawstyle="steps-post", alpha=0.7,
                    label="production (recorded)")
        ax.set_xlabel(f"time since first submission ({unit})")
    ax.set_ylabel("GPUs held (%)")
    # A light trace (the Alibaba one peaks at about 1 % of its GPUs) would be a flat line on a 0-100 % axis.
    ax.set_ylim(0, 105 if top > 50 else max(1.0, top * 1.25))
    ax.set_title(f"GPU utilisation: {len(result.states)} tasks, {result.total_gpus} GPUs")
    ax.legend(loc="lower right")
    if result.trace.fmt == "alibaba":
        fig.text(0.01, 0.01, "Trace: Alibaba cluster-trace-gpu-v2023 (CC BY 4.0)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
