"""The arithmetic of a run's cost: exact integers, split at price changes and months."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spurcloud.billing.pricing import DENOMINATOR, Held, Price, split

T0 = datetime(2026, 3, 10, tzinfo=UTC)
TWO_GPUS = Held(gpu_milli=2000, cpus=0, mem_mb=0)


def _total(periods: list) -> int:  # type: ignore[type-arg]
    return sum(p.amount_micro for p in periods)


def test_3661_seconds_on_two_gpus_cost_exactly_the_price_floored_once() -> None:
    price = Price(1, T0, gpu_hour_micro=2_500_000)
    periods, rest = split(
        T0, T0 + timedelta(seconds=3661), held=TWO_GPUS, prices=[price], remainder=0
    )
    # 2.50 × 2 × 3661 / 3600 = 5.0847222… → 5,084,722 micro-units
    assert _total(periods) == 5_084_722
    assert rest == (2_500_000 * 2000 * 1024 * 3_661_000_000) % DENOMINATOR


def test_charging_minute_by_minute_adds_up_to_the_same_total() -> None:
    price = Price(1, T0, gpu_hour_micro=2_500_000)
    total, rest, start = 0, 0, T0
    for step in [*([60] * 61), 1]:
        end = start + timedelta(seconds=step)
        periods, rest = split(start, end, held=TWO_GPUS, prices=[price], remainder=rest)
        total += _total(periods)
        start = end
    assert total == 5_084_722


def test_a_price_change_splits_the_period_at_its_effective_date() -> None:
    old = Price(1, T0 - timedelta(days=1), gpu_hour_micro=2_500_000)
    new = Price(2, T0 + timedelta(seconds=1800), gpu_hour_micro=3_000_000)
    periods, _ = split(
        T0, T0 + timedelta(seconds=3661), held=TWO_GPUS, prices=[old, new], remainder=0
    )
    assert [p.price for p in periods] == [old, new]
    assert [p.end - p.start for p in periods] == [timedelta(seconds=1800), timedelta(seconds=1861)]
    # (2.50 × 1800 + 3.00 × 1861) × 2 / 3600 = 5.6016666… → 5,601,666
    assert _total(periods) == 5_601_666


def test_a_month_start_splits_the_period() -> None:
    price = Price(1, T0 - timedelta(days=60), gpu_hour_micro=3_600_000)
    start = datetime(2026, 3, 31, 23, 30, tzinfo=UTC)
    periods, _ = split(
        start, start + timedelta(hours=1), held=TWO_GPUS, prices=[price], remainder=0
    )
    assert [p.start.month for p in periods] == [3, 4]
    assert [p.amount_micro for p in periods] == [3_600_000, 3_600_000]


def test_a_quarter_gpu_costs_a_quarter_and_cpu_and_memory_have_their_prices() -> None:
    price = Price(1, T0, gpu_hour_micro=4_000_000, cpu_hour_micro=10_000, mem_gb_hour_micro=2_000)
    held = Held(gpu_milli=250, cpus=8, mem_mb=16 * 1024)
    periods, _ = split(T0, T0 + timedelta(hours=1), held=held, prices=[price], remainder=0)
    assert _total(periods) == 1_000_000 + 8 * 10_000 + 16 * 2_000


def test_time_before_any_price_is_free() -> None:
    price = Price(1, T0 + timedelta(hours=1), gpu_hour_micro=3_600_000)
    periods, _ = split(T0, T0 + timedelta(hours=2), held=TWO_GPUS, prices=[price], remainder=0)
    assert [p.amount_micro for p in periods] == [0, 7_200_000]
