"""Prices as a renter sees them before running anything: the GPU-hour price of each model
now (the catalog, the launch form), and a job's estimated cost (price x GPUs x time
limit), checked against a prepaid balance before it is submitted: by
`jobs.services.submit_jobs`, so the API, slurmrestd, `sbatch` and the portal refuse alike
(402), and shown by the portal's launch form (`portal/launch_quote.py`), from the same
`quote_gpus`.

The estimate is an upper bound of the GPU part only (a job is charged for what it
holds while it runs, at most its time limit), rounded up to a micro-unit. The time limit
is the job's, else its partition's default (else its maximum: every partition has both,
scheduler.config); the price is the GPU model's, or for "any model" the dearest one the
cluster has."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from scheduler.core.arrays import parse_array
from scheduler.core.contract import JobSpec
from scheduler.core.contract.request import ResourceRequest
from scheduler.core.errors import Rejected
from spurcloud.billing.errors import PaymentRequired
from spurcloud.billing.ledger import open_account
from spurcloud.billing.models import BillingAccount, PriceEntry, QosClass
from spurcloud.billing.money import format_amount
from spurcloud.tenants.models import Organization

MILLI_MINUTES_PER_HOUR = 1000 * 60


@dataclass(frozen=True)
class Quote:
    micro: int
    text: str
    why: str


def gpu_hour_prices(*, now: datetime | None = None) -> dict[tuple[str, str], int]:
    """(GPU model, QoS class) -> the GPU-hour price in effect now; model "" is the
    default of models without their own."""
    now = now or timezone.now()
    prices: dict[tuple[str, str], int] = {}
    for entry in PriceEntry.objects.filter(effective_from__lte=now).order_by("effective_from"):
        prices[(entry.gpu_model, entry.qos_class)] = int(entry.gpu_hour_micro)
    return prices


def gpu_hour_price(
    prices: dict[tuple[str, str], int], gpu_model: str, qos_class: str = QosClass.ON_DEMAND
) -> int | None:
    found = prices.get((gpu_model, qos_class))
    return found if found is not None else prices.get(("", qos_class))


def estimate_micro(*, gpu_hour_micro: int, gpu_milli: int, time_limit_min: int) -> int:
    """What `gpu_milli` thousandths of GPUs cost for `time_limit_min` minutes, rounded up."""
    numerator = gpu_hour_micro * gpu_milli * time_limit_min
    return -(-numerator // MILLI_MINUTES_PER_HOUR)


def partition_limit(partitions: Sequence[dict[str, Any]], name: str) -> int | None:
    """The time limit a job without one gets in partition `name` ("": the default)."""
    for part in partitions:
        if (name and part.get("name") == name) or (not name and part.get("default")):
            return part.get("default_time_min") or part.get("max_time_min") or None
    return None


def quote_gpus(
    *,
    gpu_milli: int,
    gpu_type: str,
    time_limit_min: int | None,
    partition: str,
    partitions: Callable[[], Sequence[dict[str, Any]]],
    models: Callable[[], Sequence[str]],
    qos: str = "",
    prices: dict[tuple[str, str], int] | None = None,
) -> Quote | None:
    """The most `gpu_milli` thousandths of GPUs of `gpu_type` ("": any the cluster has)
    can cost for the time limit; None without GPUs, a time limit or a price. The
    cluster's partitions and GPU models are asked for only when needed."""
    if gpu_milli <= 0:
        return None
    minutes = time_limit_min
    if minutes is None:
        minutes = partition_limit(partitions(), partition)
    if not minutes or minutes <= 0:
        return None
    prices = gpu_hour_prices() if prices is None else prices
    qos_class = QosClass.SPOT if qos in settings.BILLING_SPOT_QOS else QosClass.ON_DEMAND
    candidates = [gpu_type] if gpu_type else (list(models()) or [""])
    found = [p for p in (gpu_hour_price(prices, m, qos_class) for m in candidates) if p is not None]
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


def spec_quote(
    spec: JobSpec,
    *,
    partitions: Callable[[], Sequence[dict[str, Any]]],
    models: Callable[[], Sequence[str]],
    prices: dict[tuple[str, str], int] | None = None,
) -> Quote | None:
    """A submission's estimate: the contract's GPUs of the job (`ResourceRequest`), times
    the tasks of an array."""
    gpu_milli = ResourceRequest.of(spec).gpu_milli
    if spec.array:
        try:
            gpu_milli *= len(parse_array(spec.array)[0])
        except Rejected:
            return None  # the controller refuses it with its own message
    return quote_gpus(
        gpu_milli=gpu_milli,
        gpu_type=spec.gpu_type,
        time_limit_min=spec.time_limit_min,
        partition=spec.partition,
        partitions=partitions,
        models=models,
        qos=spec.qos,
        prices=prices,
    )


def check_affordable(*, organization: Organization, estimate: int) -> None:
    """Refuses (PaymentRequired) a job whose estimate exceeds a prepaid balance."""
    account = open_account(organization=organization)
    if account.mode == BillingAccount.Mode.PREPAID and estimate > account.balance_micro:
        currency = settings.BILLING_CURRENCY
        raise PaymentRequired(
            f"Payment required: this job may cost up to {format_amount(estimate, currency)} "
            f"(price x GPUs x time limit), more than your balance of "
            f"{format_amount(account.balance_micro, currency)}. Top up in the billing page, "
            "or ask for fewer GPUs or a shorter time limit."
        )


def check_submissions_affordable(
    *,
    organization: Organization,
    specs: Sequence[JobSpec],
    partitions: Callable[[], Sequence[dict[str, Any]]],
    models: Callable[[], Sequence[str]],
) -> None:
    """Refuses (PaymentRequired, 402) submissions whose estimates together exceed a
    prepaid balance; postpaid and exempt organisations are never refused here."""
    account = open_account(organization=organization)
    if account.mode != BillingAccount.Mode.PREPAID:
        return
    prices = gpu_hour_prices()
    if not prices:
        return  # no price book: nothing is estimated (and the controller is not asked)
    # Asked once for the whole list, and only if a job needs them.
    partitions, models = functools.cache(partitions), functools.cache(models)
    total = 0
    for spec in specs:
        found = spec_quote(spec, partitions=partitions, models=models, prices=prices)
        total += found.micro if found is not None else 0
    if total:
        check_affordable(organization=organization, estimate=total)
