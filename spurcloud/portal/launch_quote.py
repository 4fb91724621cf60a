"""The launch form's cost estimate: price x GPUs x time limit, before submit
(`spurcloud.billing.quotes`). The time limit is the form's, else the partition's default
(else its maximum); the price is the GPU model's, or for "any model" the dearest one
the cluster has (an upper bound). No estimate without a time limit or a price."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from spurcloud.billing.money import format_amount
from spurcloud.billing.quotes import estimate_micro, gpu_hour_price, gpu_hour_prices


@dataclass(frozen=True)
class Quote:
    micro: int
    text: str
    why: str


def partition_limit(partitions: list[dict[str, Any]], name: str) -> int | None:
    for part in partitions:
        if (name and part.get("name") == name) or (not name and part.get("default")):
            return part.get("default_time_min") or part.get("max_time_min") or None
    return None


def quote(
    data: dict[str, Any], *, partitions: list[dict[str, Any]], models: list[str]
) -> Quote | None:
    gpu_milli = int(data.get("gpus") or 0) * 1000
    if not gpu_milli and data.get("gpu_fraction") is not None:
        gpu_milli = int(round(float(data["gpu_fraction"]) * 1000))
    if gpu_milli <= 0:
        return None
    minutes = data.get("time_limit_min") or partition_limit(partitions, data.get("partition") or "")
    if not minutes or minutes <= 0:
        return None
    prices = gpu_hour_prices()
    model = data.get("gpu_type") or ""
    candidates = [model] if model else (models or [""])
    found = [p for p in (gpu_hour_price(prices, m) for m in candidates) if p is not None]
    if not found:
        return None
    price = max(found)
    micro = estimate_micro(gpu_hour_micro=price, gpu_milli=gpu_milli, time_limit_min=int(minutes))
    currency = settings.BILLING_CURRENCY
    return Quote(
        micro=micro,
        text=format_amount(micro, currency),
        why=(
            f"{format_amount(price, currency)} per GPU-hour × {gpu_milli / 1000:g} GPU "
            f"× {minutes} min (the time limit): the most this job can cost."
        ),
    )


def price_list(models: list[str]) -> list[dict[str, str]]:
    """The on-demand GPU-hour price of each model the cluster has (the catalog's too)."""
    prices = gpu_hour_prices()
    rows = []
    for model in models:
        price = gpu_hour_price(prices, model)
        if price is not None:
            rows.append({"model": model, "price": format_amount(price, settings.BILLING_CURRENCY)})
    return rows
