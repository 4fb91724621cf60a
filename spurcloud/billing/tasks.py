"""Billing's Celery tasks: thin, idempotent, each calling one service. The periodic ones
are in settings.CELERY_BEAT_SCHEDULE (meter every minute, stop unpaid work every
minute, invoices and the capacity sample hourly, reconcile daily, the usage rollup
hourly, spend alerts and Stripe meter events every 5 minutes)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

from spurcloud.billing import (
    capacity,
    invoices,
    meter_events,
    metering,
    reconcile,
    reports,
    services,
    spend_alerts,
    stripe_payments,
)

log = logging.getLogger(__name__)

_RETRY: dict[str, Any] = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": 1,
    "retry_backoff_max": 60,
    "max_retries": 10,
    "acks_late": True,
    "ignore_result": True,
}


@shared_task(name="spur.billing.meter_tick", **_RETRY)  # type: ignore[untyped-decorator]
def meter_tick() -> int:
    """Charges every running job up to now (balances stay live)."""
    return metering.meter_open_runs()


@shared_task(name="spur.billing.stop_unpaid_work", **_RETRY)  # type: ignore[untyped-decorator]
def stop_unpaid_work() -> int:
    """Cancels the jobs of organisations whose credit ran out a grace period ago."""
    stopped = 0
    for organization in services.organizations_past_grace():
        stopped += len(services.stop_unpaid_work(organization=organization))
    return stopped


@shared_task(name="spur.billing.fulfil_stripe_event", **_RETRY)  # type: ignore[untyped-decorator]
def fulfil_stripe_event(event_pk: int) -> bool:
    return stripe_payments.fulfil_event(event_pk=event_pk)


@shared_task(name="spur.billing.issue_invoices", **_RETRY)  # type: ignore[untyped-decorator]
def issue_invoices() -> int:
    """Invoices last month's usage of every organisation (idempotent per month)."""
    return len(invoices.issue_last_months_invoices())


@shared_task(name="spur.billing.reconcile_runs", **_RETRY)  # type: ignore[untyped-decorator]
def reconcile_runs() -> int:
    """Closes open runs whose end never reached metering (from the job history)."""
    return reconcile.reconcile_open_runs()


@shared_task(name="spur.billing.reconcile_topups", **_RETRY)  # type: ignore[untyped-decorator]
def reconcile_topups() -> int:
    """Credits paid top-ups whose webhook never arrived (asks Stripe)."""
    return stripe_payments.reconcile_topups()


@shared_task(name="spur.billing.roll_up_usage", **_RETRY)  # type: ignore[untyped-decorator]
def roll_up_usage() -> int:
    """Rebuilds the daily usage rollup of the last two days (the revenue dashboard's)."""
    return reports.roll_up_recent(days=2)


@shared_task(name="spur.billing.report_meter_events", **_RETRY)  # type: ignore[untyped-decorator]
def report_meter_events() -> int:
    """Reports invoiced organisations' finished usage to Stripe's meter (each once)."""
    return meter_events.report_usage()


@shared_task(name="spur.billing.check_spend_alerts", **_RETRY)  # type: ignore[untyped-decorator]
def check_spend_alerts() -> int:
    """Mails the alerts crossed that have not fired this month (once per month each)."""
    return spend_alerts.check_spend_alerts()


@shared_task(name="spur.billing.record_capacity", **_RETRY)  # type: ignore[untyped-decorator]
def record_capacity() -> int | None:
    """Samples the cluster's GPUs for this hour (the utilisation chart's capacity)."""
    return capacity.record_capacity()
