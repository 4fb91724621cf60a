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


def from_decimal(value: Decimal) -> int:
    """Micro-units of a Decimal amount; ValueError when it is finer than a micro-unit."""
    micro = value * MICRO
    if micro != micro.to_integral_value():
        raise ValueError("an amount has at most six decimal places")
    return int(micro)
