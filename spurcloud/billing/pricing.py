"""What a stretch of a run costs: pure arithmetic on integers, no database.

A run's cost accrues as an exact rational number of micro-units. Its numerator over
`DENOMINATOR` adds up each period's share:

    elapsed µs × (gpu_milli × gpu price × 1024 + cpus × 1000 × cpu price × 1024
                  + mem MiB × 1000 × memory price)

(prices per hour in micro-units; 3,600,000,000 µs an hour, 1,000 milli-GPUs a GPU,
1,024 MiB a GiB). Each period charges the whole micro-units accrued so far and carries
the rest (`remainder`) to the next: however the run is cut into periods, the sum of
its charges is its total floored once. So 3,661 s on 2 GPUs at 2.50 an hour is exactly
floor(2.5 × 2 × 3661 / 3600 × 10⁶) = 5,084,722 micro-units, in one period or in 62.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

US_PER_HOUR = 3_600_000_000
MILLI_PER_GPU = 1000
MIB_PER_GIB = 1024
DENOMINATOR = US_PER_HOUR * MILLI_PER_GPU * MIB_PER_GIB


@dataclass(frozen=True)
class Price:
    """One entry of the price book, as the arithmetic needs it."""

    id: int | None
    effective_from: datetime
    gpu_hour_micro: int
    cpu_hour_micro: int = 0
    mem_gb_hour_micro: int = 0


@dataclass(frozen=True)
class Held:
    """What a run holds while it runs."""

    gpu_milli: int
    cpus: int
    mem_mb: int

    def rate(self, price: Price | None) -> int:
        """Numerator accrued per microsecond at `price` (None: free)."""
        if price is None:
            return 0
        return (
            self.gpu_milli * price.gpu_hour_micro * MIB_PER_GIB
            + self.cpus * MILLI_PER_GPU * price.cpu_hour_micro * MIB_PER_GIB
            + self.mem_mb * MILLI_PER_GPU * price.mem_gb_hour_micro
        )


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime
    price: Price | None
    amount_micro: int
    gpu_milli_seconds: int


def micros(delta: timedelta) -> int:
    """A duration in whole microseconds, exactly (timedelta keeps them as integers)."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def month_start(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def next_month(moment: datetime) -> datetime:
    start = month_start(moment)
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def price_at(prices: Sequence[Price], moment: datetime) -> Price | None:
    """The entry in effect at `moment` (`prices` sorted by effective_from)."""
    current = None
    for price in prices:
        if price.effective_from <= moment:
            current = price
        else:
            break
    return current


def split(
    start: datetime, end: datetime, *, held: Held, prices: Sequence[Price], remainder: int
) -> tuple[list[Period], int]:
    """Cuts [start, end) at price changes and month starts and charges each piece,
    carrying `remainder` through; returns the periods (empty ones left out) and the
    remainder after them."""
    cuts = {start, end}
    cuts.update(p.effective_from for p in prices if start < p.effective_from < end)
    boundary = next_month(start)
    while boundary < end:
        cuts.add(boundary)
        boundary = next_month(boundary)
    points = sorted(cuts)
    periods: list[Period] = []
    for a, b in zip(points, points[1:], strict=False):
        price = price_at(prices, a)
        elapsed = micros(b - a)
        accrued = remainder + elapsed * held.rate(price)
        amount, remainder = divmod(accrued, DENOMINATOR)
        gpu_ms = held.gpu_milli * elapsed // 1_000_000
        periods.append(Period(a, b, price, amount, gpu_ms))
    return periods, remainder
