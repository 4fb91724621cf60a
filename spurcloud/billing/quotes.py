"""Prices as a renter sees them before running anything: the GPU-hour price of each model
now (the catalog, the launch form), and a job's estimated cost (price x GPUs x time
limit), checked against a prepaid balance before it is submitted.

The estimate is an upper bound of the GPU part only (a job is charged for what it
holds while it runs, at most its time limit), rounded up to a micro-unit."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone

from spurcloud.billing.errors import PaymentRequired
from spurcloud.billing.ledger import open_account
from spurcloud.billing.models import BillingAccount, PriceEntry, QosClass
from spurcloud.billing.money import format_amount
from spurcloud.tenants.models import Organization

MILLI_MINUTES_PER_HOUR = 1000 * 60


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


def check_affordable(*, organization: Organization, estimate: int) -> None:
    """Refuses (PaymentRequired) a job whose estimate exceeds a prepaid balance."""
    account = open_account(organization=organization)
    if account.mode == BillingAccount.Mode.PREPAID and estimate > account.balance_micro:
        currency = settings.BILLING_CURRENCY
        raise PaymentRequired(
            f"This job may cost up to {format_amount(estimate, currency)} (price x GPUs x "
            f"time limit), more than your balance of "
            f"{format_amount(account.balance_micro, currency)}. Top up in the billing page, "
            "or ask for fewer GPUs or a shorter time limit."
        )
