"""`astraeus simulate`: run a trace through the real scheduler and print what it shows.

Register with ``app.command("simulate")(simulate_command)``; `simulate_main` is the same as a plain function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from astraeus.sim.engine import PlanFn, SimOptions, simulate
from astraeus.sim.report import build_report, format_report, plot_utilisation
from astraeus.sim.trace import load_trace


def simulate_main(
    machines_csv: str | Path,
    tasks_csv: str | Path,
    fmt: str = "alibaba",
    *,
    backfill: bool = True,
    preemption: bool = True,
    fifo: bool = False,
    fair_share: bool = True,
    checkpoint_interval: float = 0.0,
    victims: str = "recent",
    stop_grace: float = 30.0,
    honest_time_limits: bool = False,
    limit: int | None = None,
    arrival_scale: float = 1.0,
    max_machines: int | None = None,
    plot: str | Path | None = None,
    json_out: str | Path | None = None,
    quiet: bool = False,
    plan_fn: PlanFn | None = None,
) -> dict[str, Any]:
    """Simulate `tasks_csv` on `machines_csv`; print the report (unless quiet) and return it as a dict."""
    trace = load_trace(
        machines_csv, tasks_csv, fmt, limit=limit, honest_time_limits=honest_time_limits,
        stop_grace_seconds=stop_grace, arrival_scale=arrival_scale, max_machines=max_machines,
    )
    options = SimOptions(
        backfill=backfill, preemption=preemption, fifo=fifo, fair_share=fair_share,
        checkpoint_interval=checkpoint_interval, victims=victims,
    )
    result = simulate(trace, options, plan_fn)
    report = build_report(result)
    if plot:
        plot_utilisation(result, str(plot))
        report["plot"] = str(plot)
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if not quiet:
        print(format_report(report))
        if plot:
            print(f"Utilisation plot: {plot}")
        if json_out:
            print(f"JSON report: {json_out}")
    return report


def protocol_main(machines: str | Path, tasks: str | Path, fill: float, seeds: int, placement: str,
                  plot: str | Path | None = None, quiet: bool = False) -> dict:
    """The paper's protocol (`astraeus.sim.protocol`) for each placement named; prints the table, writes the plot."""
    from astraeus.sim.protocol import PLACEMENTS, format_protocol, plot_svg, run_protocol

    chosen = [p.strip() for p in placement.split(",") if p.strip()]
    bad = [p for p in chosen if p not in PLACEMENTS]
    if not chosen or bad:
        raise ValueError(f"--placement: use {', '.join(PLACEMENTS)} (or several joined by commas), not {placement!r}")
    if not 1.0 <= fill <= 5.0:
        raise ValueError(f"--fill is the arrived demand as a share of GPU capacity, 1.0 to 5.0 (1.3: 130 %), not {fill}")
    if not 1 <= seeds <= 1000:
        raise ValueError(f"--seeds must be 1 to 1000, not {seeds}")
    if plot is not None and not str(plot).endswith(".svg"):
        raise ValueError(f"--plot with --fill writes an SVG: name it *.svg, not {plot}")
    results = run_protocol(machines, tasks, chosen, seeds, fill)
    if not quiet:
        print(format_protocol(results, fill))
    if plot is not None:
        plot_svg(results, plot, fill)
        if not quiet:
            print(f"Allocation plot: {plot}")
    return results


def simulate_command(
    machines: Annotated[Path, typer.Option("--machines", help="Machines CSV (Alibaba node list, or name,gpus[,cpu_cores,memory_gib]).")],
    tasks: Annotated[Path, typer.Option("--tasks", help="Tasks CSV (Alibaba pod list, or submit_time,duration,gpus,priority,workspace,time_limit).")],
    fmt: Annotated[str, typer.Option("--format", help="Tasks format: alibaba or csv.")] = "alibaba",
    no_backfill: Annotated[bool, typer.Option("--no-backfill", help="Turn backfill off.")] = False,
    no_preemption: Annotated[bool, typer.Option("--no-preemption", help="Turn preemption off.")] = False,
    fifo: Annotated[bool, typer.Option("--fifo", help="Order by submission time only.")] = False,
    no_fair_share: Annotated[bool, typer.Option("--no-fair-share", help="Turn fair share off.")] = False,
    checkpoint_interval: Annotated[float, typer.Option("--checkpoint-interval", help="Seconds of run time between a task's checkpoints; 0: never saves (a preempted task loses its whole attempt).")] = 0.0,
    victims: Annotated[str, typer.Option("--victims", help="Victims of equal priority stopped first: recent (the most recently started) or least-work-lost (the fewest GPU-seconds since their last checkpoint).")] = "recent",
    stop_grace: Annotated[float, typer.Option("--stop-grace", help="Machines' stop grace in seconds.")] = 30.0,
    honest_time_limits: Annotated[bool, typer.Option("--honest-time-limits", help="Give tasks without a time limit their duration rounded up to the minute.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a GPU utilisation plot (PNG).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N tasks of the file.")] = None,
    arrival_scale: Annotated[float, typer.Option("--arrival-scale", help="Multiply arrival times by this (0.01 packs 149 days of arrivals into 1.5) to raise the load.")] = 1.0,
    max_machines: Annotated[int | None, typer.Option("--max-machines", help="Only the first N machines of the machines file.")] = None,
    fill: Annotated[float | None, typer.Option("--fill", help="The FGD paper's protocol: tasks arrive in random order, never leave, until their GPU demand is this share of GPU capacity (1.3: 130 %); prints the capacity allocated at 100 % and at this demand.")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="With --fill: how many seeded arrival orders (0, 1, ...).")] = 10,
    placement: Annotated[str, typer.Option("--placement", help="With --fill: fgd, fgd+, bestfit, random or spread, or several joined by commas (plotted side by side).")] = "fgd",
) -> None:
    """Replay a trace through the scheduler with a virtual clock; report waits, utilisation and preemptions."""
    if fmt not in ("alibaba", "csv"):
        raise typer.BadParameter("use alibaba or csv", param_hint="--format")
    if victims not in ("recent", "least-work-lost"):
        raise typer.BadParameter("use recent or least-work-lost", param_hint="--victims")
    if fill is not None:
        try:
            protocol_main(machines, tasks, fill, seeds, placement, plot)
        except (OSError, ValueError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        return
    try:
        simulate_main(
            machines, tasks, fmt, backfill=not no_backfill, preemption=not no_preemption, fifo=fifo,
            fair_share=not no_fair_share, checkpoint_interval=checkpoint_interval, victims=victims,
            stop_grace=stop_grace,
            honest_time_limits=honest_time_limits, limit=limit, arrival_scale=arrival_scale,
            max_machines=max_machines, plot=plot, json_out=json_out,
        )
    except (OSError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


sim_app = typer.Typer(add_completion=False, help="Simulate a trace through the scheduler.")
sim_app.command("simulate")(simulate_command)

if __name__ == "__main__":
    sim_app()
