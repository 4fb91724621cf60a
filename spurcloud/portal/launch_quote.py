"""The launch form's cost estimate, before submit: the form's job spec (what it would
submit) through `spurcloud.billing.quotes.spec_quote`, the same estimate that
`jobs.services.submit_jobs` checks against a prepaid balance on every path (price x
resources x time limit, in the job's QoS class); and the price list beside the form and
in the catalog, on-demand and spot."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from django.conf import settings

from scheduler.core.contract import JobSpec
from scheduler.core.errors import InvalidSpec
from scheduler.rpc.errors import RpcError
from spurcloud.billing.models import QosClass
from spurcloud.billing.money import format_amount
from spurcloud.billing.quotes import Quote, hour_prices, rates_for, spec_quote
from spurcloud.jobs.selectors import cluster_nodes

if TYPE_CHECKING:
    from spurcloud.portal.job_forms import LaunchForm

__all__ = ["Quote", "price_list", "quote"]


def quote(form: LaunchForm, *, partitions: list[dict[str, Any]]) -> Quote | None:
    """The estimate of a valid form's job; None if it has none (or is no valid spec: the
    submission then says why)."""
    try:
        spec = JobSpec.from_dict(form.spec())
    except InvalidSpec:
        return None

    @functools.cache
    def nodes() -> list[dict[str, Any]]:
        # Only when what the job may hold depends on the nodes (its memory, an exclusive
        # node); an unreachable controller estimates those parts as nothing.
        try:
            return list(cluster_nodes())
        except RpcError:
            return []

    return spec_quote(spec, partitions=lambda: partitions, nodes=nodes)


def price_list(models: list[str]) -> list[dict[str, str]]:
    """Each model the cluster has with its price per GPU-hour, on-demand and spot ("—"
    where the book has none); the catalog's too. Empty without a price book."""
    prices = hour_prices()
    if not prices:
        return []
    currency = settings.BILLING_CURRENCY
    rows = []
    for model in models:
        found = {q: rates_for(prices, model, q) for q in (QosClass.ON_DEMAND, QosClass.SPOT)}
        if not any(found.values()):
            continue
        text = {
            q: format_amount(r.gpu_hour_micro, currency) if r is not None else "—"
            for q, r in found.items()
        }
        rows.append(
            {"model": model, "price": text[QosClass.ON_DEMAND], "spot": text[QosClass.SPOT]}
        )
    return rows
