"""Micro-units as text: exact, through Decimal, never a float."""

from __future__ import annotations

from decimal import Decimal

from spurcloud.billing.models import MICRO


def to_decimal(micro: int) -> Decimal:
    return Decimal(micro) / MICRO


def format_amount(micro: int, currency: str = "") -> str:
    """`12.345678` micro-exact, shown to the cent when it has no finer part."""
    value = to_decimal(micro)
    text = f"{value:.2f}" if value == value.quantize(Decimal("0.01")) else f"{value.normalize():f}"
    return f"{text} {currency.upper()}".strip()


def format_rounded(micro: int, currency: str = "") -> str:
    """To the cent, with thousands separated: `49,307.52 USD`, for a chart's labels (its
    table beside it has the exact figure)."""
    value = to_decimal(micro).quantize(Decimal("0.01"))
    return f"{value:,.2f} {currency.upper()}".strip()


def format_compact(micro: int, currency: str = "") -> str:
    """Short, for a chart's axis: `400k USD`, `1.5M USD`, `2.5 USD`."""
    value = to_decimal(micro)
    for size, suffix in ((Decimal(10) ** 9, "G"), (Decimal(10) ** 6, "M"), (Decimal(1000), "k")):
        if abs(value) >= size:
            value, unit = value / size, suffix
            break
    else:
        unit = ""
    text = f"{value.quantize(Decimal('0.01')).normalize():f}"
    return f"{text}{unit} {currency.upper()}".strip()


def from_decimal(value: Decimal) -> int:
    """Micro-units of a Decimal amount; ValueError when it is finer than a micro-unit."""
    micro = value * MICRO
    if micro != micro.to_integral_value():
        raise ValueError("an amount has at most six decimal places")
    return int(micro)
