"""Charts as SVG, rendered on the server: no script, no library, nothing to load.

Two kinds: a stacked bar chart (one bar per day or month, one colour per series, a
value axis with round ticks and grid lines, a legend that wraps to hold every series)
and a horizontal bar chart (one bar per organisation or GPU model, its value written at
its end). Each has a <title> and a <desc> that say what it shows, and the page beside it
carries the same numbers as a table (the text alternative). Values are exact integers
(micro-units, milli-GPU-seconds, basis points); `fmt` turns one into the text shown.

Colours: ten that stay apart in colour and in greyscale (a screenshot, a printout); a
chart with more series than that keeps the largest nine and stacks the rest as one
("N more"), so no two series ever share a colour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

# Tableau 10: distinct hues and lightness steps; the last, grey, is the "N more" one.
PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#bab0ac",
]
WIDTH, HEIGHT = 720, 260
RIGHT, TOP, BOTTOM = 12, 16, 28  # BOTTOM: the day labels; the legend is below them
LEGEND_ROW = 18
CHAR_W = 6.6  # an average character at 12 px, for laying the legend out
TICKS = 4  # about this many steps up the value axis


@dataclass(frozen=True)
class Bar:
    label: str
    values: dict[str, int]  # series name -> value

    @property
    def total(self) -> int:
        return sum(self.values.values())


def nice_ticks(top: int, *, steps: int = TICKS) -> list[int]:
    """Round values from 0 to at least `top`: a step of 1, 2 or 5 times a power of ten."""
    if top <= 0:
        return [0, 1]
    raw = top / steps
    magnitude = 10 ** max(0, math.floor(math.log10(raw)))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(-(-top // step) + 1)]


def limit_series(bars: Sequence[Bar], names: Sequence[str]) -> tuple[list[Bar], list[str]]:
    """At most len(PALETTE) series: the largest keep their own; the rest become one."""
    if len(names) <= len(PALETTE):
        return list(bars), list(names)
    totals = {n: sum(b.values.get(n, 0) for b in bars) for n in names}
    keep = sorted(names, key=lambda n: (-totals[n], n))[: len(PALETTE) - 1]
    rest = f"{len(names) - len(keep)} more"
    merged = []
    for bar in bars:
        values = {n: v for n, v in bar.values.items() if n in keep}
        values[rest] = sum(v for n, v in bar.values.items() if n not in keep)
        merged.append(Bar(bar.label, values))
    return merged, [n for n in names if n in keep] + [rest]


def _left_margin(labels: Sequence[str]) -> int:
    """Room for the longest tick label, left of the plot."""
    return max(48, int(max((len(t) for t in labels), default=0) * CHAR_W) + 14)


def _legend(names: Sequence[str], *, y0: float, left: int) -> tuple[list[str], float]:
    """The legend's items, wrapped into rows under the plot; and the height it takes."""
    parts: list[str] = []
    x, y = float(left), y0
    for j, name in enumerate(names):
        text = (name or "other")[:28]
        width = 14 + len(text) * CHAR_W + 16
        if x + width > WIDTH - RIGHT and x > left:
            x, y = float(left), y + LEGEND_ROW
        parts.append(
            format_html(
                '<rect x="{}" y="{}" width="10" height="10" fill="{}"/>'
                '<text x="{}" y="{}" font-size="12">{}</text>',
                _n(x),
                _n(y),
                PALETTE[j % len(PALETTE)],
                _n(x + 14),
                _n(y + 9),
                text,
            )
        )
        x += width
    return parts, (y - y0 + LEGEND_ROW) if names else 0.0


def _axis(
    ticks: Sequence[int], *, plot_h: float, fmt: Callable[[int], str], left: int
) -> list[str]:
    """Grid lines and labels at each tick of the value axis, and the baseline."""
    top = ticks[-1]
    parts: list[str] = []
    for tick in ticks:
        y = TOP + plot_h - plot_h * tick / top
        colour = "#333" if tick == 0 else "#e1e4e8"
        parts.append(
            format_html(
                '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}"/>'
                '<text x="{}" y="{}" text-anchor="end" font-size="12">{}</text>',
                left,
                _n(y),
                WIDTH - RIGHT,
                _n(y),
                colour,
                left - 6,
                _n(y + 4),
                fmt(tick),
            )
        )
    return parts


def stacked_bars(
    bars: Sequence[Bar],
    *,
    title: str,
    fmt: Callable[[int], str],
    axis_fmt: Callable[[int], str] | None = None,
    series: Sequence[str] | None = None,
) -> SafeString:
    """The chart's SVG markup (safe: every text in it is escaped). `fmt` writes a value
    (each bar's tooltip, the description), `axis_fmt` the axis's ticks (default `fmt`).
    Without `series`, the largest series is stacked lowest (and first in the legend)."""
    if series is not None:
        names = list(series)
    else:
        totals: dict[str, int] = {}
        for bar in bars:
            for name, value in bar.values.items():
                totals[name] = totals.get(name, 0) + value
        names = sorted(totals, key=lambda n: (-totals[n], n))
    description = _describe(bars, names, fmt)
    bars, names = limit_series(bars, names)
    ticks = nice_ticks(max([b.total for b in bars] + [0]))
    top = ticks[-1]
    axis_fmt = axis_fmt or fmt
    left = _left_margin([axis_fmt(t) for t in ticks])
    plot_w, plot_h = WIDTH - left - RIGHT, HEIGHT - TOP - BOTTOM
    legend, legend_h = _legend(names, y0=HEIGHT + 4, left=left) if len(names) > 1 else ([], 0.0)
    height = HEIGHT + (legend_h + 8 if legend else 0)
    step = plot_w / max(len(bars), 1)
    bar_w = max(step * 0.8, 1.0)
    parts = [
        format_html(
            '<svg class="chart" viewBox="0 0 {} {}" role="img" '
            'xmlns="http://www.w3.org/2000/svg"><title>{}</title><desc>{}</desc>',
            WIDTH,
            _n(height),
            title,
            description,
        ),
        *_axis(ticks, plot_h=plot_h, fmt=axis_fmt, left=left),
    ]
    label_every = max(1, -(-len(bars) // 12))
    for i, bar in enumerate(bars):
        x = left + i * step + (step - bar_w) / 2
        y: float = TOP + plot_h
        for j, name in enumerate(names):
            value = bar.values.get(name, 0)
            if value <= 0:
                continue
            h = plot_h * value / top
            y -= h
            parts.append(
                format_html(
                    '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                    "<title>{} {}: {}</title></rect>",
                    _n(x),
                    _n(y),
                    _n(bar_w),
                    _n(h),
                    PALETTE[j % len(PALETTE)],
                    bar.label,
                    name or "other",
                    fmt(value),
                )
            )
        if i % label_every == 0:
            parts.append(
                format_html(
                    '<text x="{}" y="{}" text-anchor="middle" font-size="11">{}</text>',
                    _n(x + bar_w / 2),
                    TOP + plot_h + 16,
                    bar.label,
                )
            )
    parts.extend(legend)
    parts.append(mark_safe("</svg>"))
    return mark_safe("".join(str(p) for p in parts))


ROW_H = 22
LABEL_W = 170  # the horizontal chart's labels, left of its bars


def horizontal_bars(
    rows: Sequence[tuple[str, int]], *, title: str, fmt: Callable[[int], str]
) -> SafeString:
    """One bar per (label, value), largest first as given, each labelled with its value:
    for many categories with long names (organisations, GPU models)."""
    ticks = nice_ticks(max([v for _, v in rows] + [0]))
    top = ticks[-1]
    value_w = 110  # room for the value written after the longest bar
    plot_w = WIDTH - LABEL_W - RIGHT - value_w
    height = TOP + len(rows) * ROW_H + 8
    parts = [
        format_html(
            '<svg class="chart" viewBox="0 0 {} {}" role="img" '
            'xmlns="http://www.w3.org/2000/svg"><title>{}</title><desc>{}</desc>',
            WIDTH,
            height,
            title,
            _describe_rows(rows, fmt),
        ),
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>',
            LABEL_W,
            TOP - 4,
            LABEL_W,
            TOP + len(rows) * ROW_H,
        ),
    ]
    for i, (label, value) in enumerate(rows):
        y = TOP + i * ROW_H
        w = plot_w * max(value, 0) / top
        name = label or "other"
        parts.append(
            format_html(
                '<text x="{}" y="{}" text-anchor="end" font-size="12">{}</text>'
                '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}: {}</title></rect>'
                '<text x="{}" y="{}" font-size="12">{}</text>',
                LABEL_W - 6,
                y + 14,
                name if len(name) <= 26 else name[:25] + "…",
                LABEL_W,
                y + 3,
                _n(w),
                ROW_H - 6,
                PALETTE[0],
                name,
                fmt(value),
                _n(LABEL_W + w + 6),
                y + 14,
                fmt(value),
            )
        )
    parts.append(mark_safe("</svg>"))
    return mark_safe("".join(str(p) for p in parts))


def _n(value: float) -> str:
    return f"{value:.1f}"


def _describe(bars: Sequence[Bar], names: Sequence[str], fmt: Callable[[int], str]) -> str:
    if not bars:
        return "No data in this period."
    peak = max(bars, key=lambda b: b.total)
    total = sum(b.total for b in bars)
    return escape(
        f"{len(bars)} bars from {bars[0].label} to {bars[-1].label}; total {fmt(total)}; "
        f"highest {fmt(peak.total)} on {peak.label}; series: "
        f"{', '.join(n or 'other' for n in names) or 'none'}."
    )


def _describe_rows(rows: Sequence[tuple[str, int]], fmt: Callable[[int], str]) -> str:
    if not rows:
        return "No data in this period."
    label, value = max(rows, key=lambda r: r[1])
    total = sum(v for _, v in rows)
    return escape(
        f"{len(rows)} bars; total {fmt(total)}; highest {fmt(value)}, {label or 'other'}."
    )
