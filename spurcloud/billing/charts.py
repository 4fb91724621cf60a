"""Charts as SVG, rendered on the server: no script, no library, nothing to load.

A stacked bar chart (one bar per day or month, one colour per series) with its axis,
a legend, and a <title>/<desc> that say what it shows; the page beside it carries the
same numbers as a table (the text alternative). Values are exact integers (micro-units,
milli-GPU-seconds); `fmt` turns one into the text shown."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

# Distinguishable in colour and in greyscale (a screenshot, a printout).
PALETTE = ["#1f5fa8", "#e07b00", "#2a9d4b", "#b8336a", "#6b4fbb", "#7f7f7f", "#c9a400"]
WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 88, 12, 16, 48


@dataclass(frozen=True)
class Bar:
    label: str
    values: dict[str, int]  # series name -> value

    @property
    def total(self) -> int:
        return sum(self.values.values())


def stacked_bars(
    bars: Sequence[Bar],
    *,
    title: str,
    fmt: Callable[[int], str],
    series: Sequence[str] | None = None,
) -> SafeString:
    """The chart's SVG markup (safe: every text in it is escaped)."""
    names = list(series) if series is not None else sorted({k for b in bars for k in b.values})
    top = max([b.total for b in bars] + [1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(bars), 1)
    bar_w = max(step * 0.8, 1.0)
    parts = [
        format_html(
            '<svg class="chart" viewBox="0 0 {} {}" role="img" '
            'xmlns="http://www.w3.org/2000/svg"><title>{}</title><desc>{}</desc>',
            WIDTH,
            HEIGHT,
            title,
            _describe(bars, names, fmt),
        ),
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>'
            '<text x="{}" y="{}" text-anchor="end" font-size="12">{}</text>'
            '<text x="{}" y="{}" text-anchor="end" font-size="12">0</text>',
            LEFT,
            TOP + plot_h,
            LEFT + plot_w,
            TOP + plot_h,
            LEFT - 6,
            TOP + 10,
            fmt(top),
            LEFT - 6,
            TOP + plot_h,
        ),
    ]
    label_every = max(1, len(bars) // 12)
    for i, bar in enumerate(bars):
        x = LEFT + i * step + (step - bar_w) / 2
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
    for j, name in enumerate(names[:8]):
        lx = LEFT + j * 90
        parts.append(
            format_html(
                '<rect x="{}" y="{}" width="10" height="10" fill="{}"/>'
                '<text x="{}" y="{}" font-size="12">{}</text>',
                lx,
                HEIGHT - 14,
                PALETTE[j % len(PALETTE)],
                lx + 14,
                HEIGHT - 5,
                (name or "other")[:12],
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
