"""The FGD paper's protocol (Weng et al., USENIX ATC 2023): fill the trace's machines with its tasks and measure
how much GPU capacity gets allocated.

Tasks arrive one by one in a random order (seeded; when every task of the trace has arrived, another shuffled
pass begins) and never leave, until their GPU demand reaches `fill` times the machines' GPU capacity. Each is
placed by the scheduler's own placement (`astraeus.scheduler.fragments.Placer`) or, for `random`, on a machine
and GPU drawn at random among those that fit; one that fits nowhere is not placed. The figure is the share of GPU
capacity allocated when the arrived demand reaches 100 % and 130 % of capacity. The task distribution FGD scores
against is the trace's tasks (the workload's sizes, as in the paper).
"""

from __future__ import annotations

import csv
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from astraeus.scheduler.fragments import WHOLE, Placer, Request, Room, choices, fits

PLACEMENTS = ("fgd", "fgd+", "bestfit", "random", "spread")
# The paper's figures (Fig. 7, default trace): share of GPU capacity allocated at 100 % / 130 % arrived demand.
PAPER = {"random": (86.3, 87.5), "dotprod": (90.6, 90.9), "bestfit": (92.9, 93.1), "fgd": (95.2, 95.4)}


def read_rooms(path: str | Path) -> list[Room]:
    """Machines of an `openb_node_list_*.csv` (sn, cpu_milli, memory_mib, gpu, model) as empty rooms."""
    rooms = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                gpus = int(row["gpu"])
                rooms.append(Room((WHOLE,) * gpus, int(row["cpu_milli"]), int(row["memory_mib"])))
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}: a machine row needs sn, cpu_milli, memory_mib and gpu ({e})") from e
    if not rooms:
        raise ValueError(f"{path}: no machines")
    return rooms


def read_requests(path: str | Path) -> list[Request]:
    """Tasks of an `openb_pod_list_*.csv` as requests (num_gpu, gpu_milli, cpu_milli, memory_mib)."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                n, milli = int(row["num_gpu"] or 0), int(row["gpu_milli"] or 0)
                out.append(Request(n, milli if n else WHOLE, int(row["cpu_milli"] or 0), int(row["memory_mib"] or 0)))
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}: a task row needs num_gpu, gpu_milli, cpu_milli and memory_mib ({e})") from e
    if not any(r.gpus for r in out):
        raise ValueError(f"{path}: no task asks for a GPU")
    return out


@dataclass
class SeedResult:
    seed: int
    at: dict[float, float]  # arrived demand (share of capacity) -> allocated share, in %
    curve: list[tuple[float, float]] = field(default_factory=list)  # (arrived %, allocated %)


def fill(rooms: list[Room], requests: list[Request], placement: str, seed: int, upto: float = 1.3,
         marks: tuple[float, ...] = (1.0, 1.3), points: int = 60) -> SeedResult:
    """One seed of the protocol."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    capacity = sum(len(r.free) for r in rooms) * WHOLE
    rng = random.Random(seed)
    sizes = tuple(Counter(requests).items())
    placer = Placer(rooms, "bestfit" if placement == "random" else placement, sizes)
    arrived = allocated = 0
    order: list[Request] = []
    result = SeedResult(seed=seed, at={})
    pending = sorted(marks)
    step = upto / points
    next_point = step
    while arrived < upto * capacity:
        if not order:
            order = requests[:]
            rng.shuffle(order)
        r = order.pop()
        arrived += r.demand
        if placement == "random":
            ok = [i for i, room in enumerate(placer.rooms) if fits(room, r)]
            chosen = None
            if ok:
                i = rng.choice(ok)
                gpus = rng.choice(choices(placer.rooms[i], r))[0]
                chosen = (i, gpus)
        else:
            chosen = placer.choose(r)
        if chosen is not None:
            placer.take(chosen[0], chosen[1], r)
            allocated += r.demand
        while pending and arrived >= pending[0] * capacity:
            result.at[pending.pop(0)] = 100.0 * allocated / capacity
        while arrived >= next_point * capacity and next_point <= upto + 1e-9:
            result.curve.append((100.0 * next_point, 100.0 * allocated / capacity))
            next_point += step
    for m in pending:
        result.at[m] = 100.0 * allocated / capacity
    return result


def run_protocol(machines: str | Path, tasks: str | Path, placements: list[str], seeds: int = 10,
                 upto: float = 1.3) -> dict[str, list[SeedResult]]:
    rooms, requests = read_rooms(machines), read_requests(tasks)
    return {p: [fill(rooms, requests, p, s, upto, marks=(1.0, upto)) for s in range(seeds)] for p in placements}


def format_protocol(results: dict[str, list[SeedResult]], upto: float = 1.3) -> str:
    marks = (1.0, upto)
    head = "  ".join(f"{m * 100:.0f}% demand" for m in marks)
    lines = []
    for p, runs in results.items():
        lines.append(f"placement {p}: GPU capacity allocated at   {head}")
        for r in runs:
            lines.append(f"  seed {r.seed:<3}" + "".join(f"{r.at[m]:>13.1f}%" for m in marks))
        means = [sum(r.at[m] for r in runs) / len(runs) for m in marks]
        paper = PAPER.get(p)
        lines.append("  mean    " + "".join(f"{v:>13.1f}%" for v in means)
                     + f"   unallocated at {marks[-1] * 100:.0f}%: {100 - means[-1]:.1f}%"
                     + (f"   (paper: {paper[0]}% / {paper[1]}%)" if paper else ""))
    return "\n".join(lines)


_COLOURS = {"fgd": "#1b7837", "fgd+": "#01665e", "bestfit": "#2166ac", "random": "#b2182b", "spread": "#8c6bb1", "dotprod": "#e08214"}


def plot_svg(results: dict[str, list[SeedResult]], path: str | Path, upto: float = 1.3) -> None:
    """Allocation against arrived demand (mean of the seeds) for each placement, beside the paper's bars."""
    w, h, left, top, pw, ph = 860, 400, 60, 30, 420, 300
    x0, x1, y0, y1 = 0.0, upto * 100, 50.0, 100.0

    def xy(x: float, y: float) -> tuple[float, float]:
        return left + (x - x0) / (x1 - x0) * pw, top + ph - (max(y, y0) - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>',
           f'<text x="{left + pw / 2}" y="{h - 20}" text-anchor="middle">arrived GPU demand (% of capacity)</text>',
           f'<text x="15" y="{top + ph / 2}" transform="rotate(-90 15 {top + ph / 2})" text-anchor="middle">'
           'GPU capacity allocated (%)</text>']
    for t in range(0, int(x1) + 1, 20):
        x, y = xy(t, y0)
        out.append(f'<text x="{x}" y="{y + 15}" text-anchor="middle">{t}</text>')
    for t in range(int(y0), 101, 10):
        x, y = xy(x0, t)
        out.append(f'<text x="{x - 5}" y="{y + 4}" text-anchor="end">{t}</text>'
                   f'<line x1="{left}" x2="{left + pw}" y1="{y}" y2="{y}" stroke="#ddd"/>')
    for n, (p, runs) in enumerate(results.items()):
        k = min(len(r.curve) for r in runs)
        pts = [(runs[0].curve[j][0], sum(r.curve[j][1] for r in runs) / len(runs)) for j in range(k)]
        line = " ".join("{:.1f},{:.1f}".format(*xy(x, y)) for x, y in pts)
        c = _COLOURS.get(p, "#000")
        out.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{left + 10}" y="{top + 18 + 16 * n}" fill="{c}">{p} (Astraeus)</text>')
    # The paper's figures and ours at 100 % / 130 %, as bars.
    bx, bw = left + pw + 60, 300
    out.append(f'<text x="{bx}" y="{top - 8}">allocated at 100% / 130% demand: Astraeus vs paper</text>')
    rows = [(f"{p} (Astraeus)", tuple(sum(r.at[m] for r in runs) / len(runs) for m in (1.0, upto)), p)
            for p, runs in results.items()]
    rows += [(f"{p} (paper)", v, p) for p, v in PAPER.items()]
    for n, (label, vals, p) in enumerate(rows):
        y = top + 10 + n * 34
        c = _COLOURS.get(p, "#000")
        for k, v in enumerate(vals):
            length = (max(v, 80.0) - 80.0) / 20.0 * (bw - 110)
            out.append(f'<rect x="{bx + 110}" y="{y + k * 12}" width="{length:.1f}" height="10" fill="{c}" '
                       f'opacity="{1.0 if "paper" not in label else 0.5}"/>'
                       f'<text x="{bx + 114 + length:.1f}" y="{y + 9 + k * 12}" font-size="10">{v:.1f}</text>')
        out.append(f'<text x="{bx}" y="{y + 15}" font-size="11">{label}</text>')
    out.append(f'<text x="{bx}" y="{top + 10 + len(rows) * 34 + 10}" font-size="10">bars start at 80%</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")
