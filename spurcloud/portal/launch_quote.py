"""The launch form's cost estimate: price x GPUs x time limit, before submit, from the
form's fields through `spurcloud.billing.quotes.quote_gpus` (the same estimate that
`jobs.services.submit_jobs` checks against a prepaid balance on every path)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from spurcloud.billing.money import format_amount
from spurcloud.billing.quotes import Quote, gpu_hour_price, gpu_hour_prices, quote_gpus

__all__ = ["Quote", "price_list", "quote"]


def quote(
    data: dict[str, Any], *, partitions: list[dict[str, Any]], models: list[str]
) -> Quote | None:
    gpu_milli = int(data.get("gpus") or 0) * 1000
    if not gpu_milli and data.get("gpu_fraction") is not None:
        gpu_milli = int(round(float(data["gpu_fraction"]) * 1000))
    return quote_gpus(
        gpu_milli=gpu_milli,
        gpu_type=data.get("gpu_type") or "",
        time_limit_min=data.get("time_limit_min") or None,
        partition=data.get("partition") or "",
        partitions=lambda: partitions,
        models=lambda: models,
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
