"""The console's charts, drawn on the server as SVG (no script, no chart library): bars, stacked bars, a step
line/area, a histogram and a sparkline, with axis ticks, a legend and an accessible <title>/<desc>. Each scales to
its container through its viewBox (CSS sets its width), so it reads at phone width. Pure: data in, markup out; the
pages (usage_pages.py) read the data and show a table of the same figures under each chart.

Also the series the charts draw that are not a report's lines: `step_series` (GPUs in use over time, from
intervals of held GPUs) and `daily` (a step series summed per UTC day)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from html import escape

EMPTY = "No usage yet"
# Series colours (colour-blind friendly, Okabe-Ito order), reused in turn past the eighth series.
PALETTE = ("#2f6fed", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#8250df", "#6b7280")
W, H = 640, 260  # the viewBox of a full chart; it scales to the page's width
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 22, 34  # the plot's margins inside the viewBox (axis labels live there)


@dataclass(frozen=True)
class Series:
    name: str
    values: list[float]  # one per category


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


# -------------------------------------------------------------------------------------------- axes


def ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 × a power of ten) up to the first tick at or above `top`: an axis of
    about `count` intervals. `top` ≤ 0 gives [0, 1]."""
    if not top or top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw - 1e-12)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def label(v: float) -> str:
    """A tick's label: no trailing zeros (2, 2.5, 0.25, 0.005), tens of thousands as k."""
    if abs(v) >= 10000:
        return f"{v / 1000:g}k"
    return f"{round(v, 10):g}"


def figure(v: float) -> str:
    """A figure in a table under a chart: two decimals (3.25), four below 0.01 (0.0021) so a short run shows."""
    if v == 0:
        return "0.00"
    return f"{v:.2f}" if abs(v) >= 0.01 else f"{v:.4f}"


def _open(cid: str, title: str, desc: str, w: int = W, h: int = H, cls: str = "chart") -> list[str]:
    return [f'<svg class="{cls}" id="{escape(cid)}" viewBox="0 0 {w} {h}" role="img" '
            f'aria-labelledby="{escape(cid)}-title {escape(cid)}-desc" preserveAspectRatio="xMidYMid meet" '
            f'xmlns="http://www.w3.org/2000/svg">',
            f'<title id="{escape(cid)}-title">{escape(title)}</title>',
            f'<desc id="{escape(cid)}-desc">{escape(desc)}</desc>']


def _empty(cid: str, title: str, desc: str) -> str:
    out = _open(cid, title, desc, h=120)
    out.append(f'<text class="empty" x="{W / 2}" y="64" text-anchor="middle">{EMPTY}</text></svg>')
    return "".join(out)


def _y_axis(top: float, unit: str) -> tuple[list[str], float]:
    """The horizontal grid lines and their labels; returns them and the axis's top value."""
    ts = ticks(top)
    hi = ts[-1]
    out = []
    for t in ts:
        y = _y(t, hi)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label(t)}</text>')
    out.append(f'<text class="unit" x="2" y="{TOP - 10}">{escape(unit)}</text>')
    return out, hi


def _y(v: float, hi: float) -> float:
    return TOP + (H - TOP - BOTTOM) * (1 - (v / hi if hi else 0))


def _x_labels(categories: list[str], every: int) -> list[str]:
    out = []
    band = (W - LEFT - RIGHT) / max(1, len(categories))
    for i, c in enumerate(categories):
        if i % every == 0:
            x = LEFT + band * (i + 0.5)
            out.append(f'<text class="tick" x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{escape(c)}</text>')
    return out


def legend(names: list[str]) -> str:
    """The series' names and colours, as HTML under the chart (it wraps at phone width)."""
    items = "".join(f'<li><span class="swatch" style="background:{colour(i)}"></span>{escape(n)}</li>'
                    for i, n in enumerate(names))
    return f'<ul class="legend">{items}</ul>'


# -------------------------------------------------------------------------------------------- charts


def _num(v: float) -> str:
    return f"{v:g}" if float(v).is_integer() else figure(v)


def stacked_bars(cid: str, title: str, desc: str, categories: list[str], series: list[Series],
                 unit: str = "", short: dict[str, str] | None = None) -> str:
    """One bar per category, each series' value stacked on the previous ones (a bar's top is their sum). A bar
    segment is a `rect.chart-bar` with data-series and data-category; a zero draws nothing. `short`: shorter labels for
    the categories on the axis."""
    sums = [sum(s.values[i] for s in series) for i in range(len(categories))]
    if not categories or not any(v > 0 for v in sums):
        return _empty(cid, title, desc)
    out = _open(cid, title, desc)
    axis, hi = _y_axis(max(sums), unit)
    out += axis
    band = (W - LEFT - RIGHT) / len(categories)
    width = max(1.0, band * 0.7)
    for i, cat in enumerate(categories):
        base = 0.0
        x = LEFT + band * i + (band - width) / 2
        for k, s in enumerate(series):
            v = s.values[i]
            if v <= 0:
                continue
            y0, y1 = _y(base, hi), _y(base + v, hi)
            out.append(f'<rect class="chart-bar" data-series="{escape(s.name)}" data-category="{escape(cat)}" '
                       f'x="{x:.1f}" y="{y1:.1f}" width="{width:.1f}" height="{max(0.5, y0 - y1):.1f}" '
                       f'fill="{colour(k)}"><title>{escape(s.name)}, {escape(cat)}: {_num(v)} {escape(unit)}'
                       f'</title></rect>')
            base += v
    labels = [(short or {}).get(c, c) for c in categories]
    out += _x_labels(labels, max(1, math.ceil(len(categories) / 10)))
    out.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{_y(0, hi):.1f}" y2="{_y(0, hi):.1f}"/>')
    out.append("</svg>")
    return "".join(out)


def bars(cid: str, title: str, desc: str, categories: list[str], values: list[float], unit: str = "",
         name: str = "") -> str:
    """Plain bars: one series."""
    return stacked_bars(cid, title, desc, categories, [Series(name or unit, values)], unit)


def histogram(cid: str, title: str, desc: str, buckets: list[str], counts: list[int], unit: str = "attempts") -> str:
    """Counts per bucket (the buckets in order, labelled by their range)."""
    return bars(cid, title, desc, buckets, [float(c) for c in counts], unit, name=unit)


def area(cid: str, title: str, desc: str, points: list[tuple[float, float]], lo: float, hi: float,
         ceiling: float, unit: str = "GPUs") -> str:
    """A step line over [lo, hi) with the area under it filled (`points`: (time, value) from step_series), and a
    dashed line at `ceiling` (what is present); the time axis is labelled by UTC day."""
    if hi <= lo or not any(v > 0 for _, v in points):
        return _empty(cid, title, desc)
    out = _open(cid, title, desc)
    axis, top = _y_axis(max([ceiling] + [v for _, v in points]), unit)
    out += axis

    def x(t: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * (min(max(t, lo), hi) - lo) / (hi - lo)

    path = [f"M{x(lo):.1f},{_y(0, top):.1f}"]
    prev = 0.0
    for t, v in points:
        path.append(f"L{x(t):.1f},{_y(prev, top):.1f}L{x(t):.1f},{_y(v, top):.1f}")
        prev = v
    path.append(f"L{x(hi):.1f},{_y(prev, top):.1f}")
    line = "".join(path)
    out.append(f'<path class="area" d="{line}L{x(hi):.1f},{_y(0, top):.1f}Z" fill="{colour(0)}" fill-opacity=".18"/>')
    out.append(f'<path class="line series" data-series="in use" d="{line}" fill="none" stroke="{colour(0)}" '
               'stroke-width="1.5"/>')
    if ceiling > 0:
        y = _y(ceiling, top)
        out.append(f'<line class="ceiling series" data-series="present" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" '
                   f'y2="{y:.1f}" stroke="{colour(5)}" stroke-dasharray="4 3"/>')
    days = max(1, math.ceil((hi - lo) / 86400))
    every = max(1, math.ceil(days / 8)) * 86400
    t = math.ceil(lo / 86400) * 86400
    while t < hi:
        out.append(f'<text class="tick" x="{x(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">'
                   f'{time.strftime("%m-%d", time.gmtime(t))}</text>')
        out.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>')
        t += every
    out.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{_y(0, top):.1f}" y2="{_y(0, top):.1f}"/>')
    out.append("</svg>")
    return "".join(out)


def sparkline(cid: str, title: str, points: list[tuple[float, float]], lo: float, hi: float,
              ceiling: float) -> str:
    """A small step line of `points` over [lo, hi), from 0 to `ceiling` (the machine's GPUs): no axes, its
    title says what it shows."""
    w, h = 120, 24
    out = _open(cid, title, title, w, h, cls="spark")
    top = ceiling or max([1.0] + [v for _, v in points])

    def x(t: float) -> float:
        return w * (min(max(t, lo), hi) - lo) / (hi - lo) if hi > lo else 0.0

    def y(v: float) -> float:
        return h - 1 - (h - 2) * min(v, top) / top

    d, prev = [f"M0,{y(0):.1f}"], 0.0
    for t, v in points:
        d.append(f"L{x(t):.1f},{y(prev):.1f}L{x(t):.1f},{y(v):.1f}")
        prev = v
    d.append(f"L{w},{y(prev):.1f}")
    line = "".join(d)
    out.append(f'<path class="area" d="{line}L{w},{h}L0,{h}Z" fill="{colour(0)}" fill-opacity=".2"/>')
    out.append(f'<path class="line" d="{line}" fill="none" stroke="{colour(0)}" stroke-width="1.2"/></svg>')
    return "".join(out)


# -------------------------------------------------------------------------------------------- series


def step_series(intervals: list[tuple[float, float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """How much is held over [lo, hi), from intervals (start, end, amount) of it held: (time, amount from then
    on) at `lo` and at every change, clipped to the window; simultaneous changes are one point."""
    changes: dict[float, float] = {}
    for start, end, n in intervals:
        s, e = max(start, lo), min(end, hi)
        if e <= s or not n:
            continue
        changes[s] = changes.get(s, 0.0) + n
        changes[e] = changes.get(e, 0.0) - n
    out = [(lo, 0.0)]
    level = 0.0
    for t in sorted(changes):
        if t >= hi:  # held until the window's end: no change inside it
            break
        level += changes[t]
        level = 0.0 if abs(level) < 1e-9 else level
        if t == out[-1][0]:
            out[-1] = (t, level)
        elif level != out[-1][1]:
            out.append((t, level))
    return out


def daily(points: list[tuple[float, float]], lo: float, hi: float) -> list[dict]:
    """A step series summed per UTC day within [lo, hi): each day's `amount_seconds` (the area under it),
    `seconds` (of the day inside the window), `average` and `peak`."""
    out: list[dict] = []
    day_start = lo
    while day_start < hi:
        day_end = min(hi, (math.floor(day_start / 86400) + 1) * 86400)
        area_, peak = 0.0, 0.0
        for i, (t, v) in enumerate(points):
            nxt = points[i + 1][0] if i + 1 < len(points) else hi
            s, e = max(t, day_start), min(nxt, day_end)
            if e > s:
                area_ += v * (e - s)
                peak = max(peak, v)
        secs = day_end - day_start
        out.append({"day": time.strftime("%Y-%m-%d", time.gmtime(day_start)), "amount_seconds": area_,
                    "seconds": secs, "average": area_ / secs if secs else 0.0, "peak": peak})
        day_start = day_end
    return out
