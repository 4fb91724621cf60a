"""Stripe Billing Meter events for invoiced (postpaid) organisations: each usage record of
a closed run is reported once, as a meter event (`POST /v1/billing/meter_events`, the
official library) whose value is the record's amount in micro-units of
`BILLING_CURRENCY` (price the meter at 0.000001 per unit; it sums them), on the
organisation's Stripe customer.

Exactly once, in two steps: `claim_records` inserts a `MeterEventReport` per record
(unique per record, `ON CONFLICT DO NOTHING`), then `send_claimed` sends each unsent
one with an `identifier` derived from the record's key (cluster, job, attempt, period
start) and an idempotency key derived from the identifier, and marks it sent
conditionally. A worker killed between Stripe's answer and the mark resends the same
identifier: Stripe counts an identifier once. Records of open runs wait (metering may
still rewrite them), and so does usage from before the organisation became invoiced
(`BillingAccount.postpaid_since`, else its opening) or older than Stripe accepts
(35 days).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta

import stripe
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Coalesce
from django.utils import timezone

from spurcloud.billing.errors import PaymentProviderError
from spurcloud.billing.models import BillingAccount, MeterEventReport, UsageRecord
from spurcloud.billing.stripe_payments import ensure_customer, stripe_client

log = logging.getLogger(__name__)

STRIPE_WINDOW = timedelta(days=35)  # Stripe refuses meter events older than this
IDENTIFIER_MAX = 100  # Stripe's limit on an identifier's length


def event_identifier(record: UsageRecord) -> str:
    """The record's key as a meter event identifier: the same however often it is sent."""
    run = record.run
    key = f"spur-{run.cluster}-{run.job_id}-{run.attempt}-{int(record.period_start.timestamp())}"
    if len(key) <= IDENTIFIER_MAX:
        return key
    return "spur-" + hashlib.sha256(key.encode()).hexdigest()


def claim_records(*, now: datetime | None = None, limit: int = 1000) -> int:
    """Claims up to `limit` records due to be reported; returns how many it claimed."""
    now = now or timezone.now()
    invoiced = BillingAccount.objects.filter(
        organization=OuterRef("organization"),
        mode=BillingAccount.Mode.POSTPAID,
    ).annotate(since=Coalesce("postpaid_since", "created_at"))
    due = (
        UsageRecord.objects.filter(
            run__ended_at__isnull=False,
            amount_micro__gt=0,
            period_end__gt=now - STRIPE_WINDOW,
        )
        .filter(Exists(invoiced.filter(since__lte=OuterRef("period_start"))))
        .filter(~Exists(MeterEventReport.objects.filter(usage_record_id=OuterRef("pk"))))
        .select_related("run")
        .order_by("pk")[:limit]
    )
    reports = [
        MeterEventReport(
            usage_record_id=record.pk,
            organization_id=record.organization_id,
            identifier=event_identifier(record),
            value_micro=record.amount_micro,
            timestamp=min(record.period_end, now),
        )
        for record in due
    ]
    created = MeterEventReport.objects.bulk_create(reports, ignore_conflicts=True)
    return len(created)


def send_claimed(*, limit: int = 1000) -> int:
    """Sends the claimed reports not yet sent (oldest first); returns how many Stripe
    accepted. A report Stripe refuses, or could not be sent, waits for the next run."""
    pending = list(
        MeterEventReport.objects.filter(reported_at__isnull=True)
        .select_related("organization")
        .order_by("pk")[:limit]
    )
    if not pending:
        return 0
    client = stripe_client()
    customers: dict[int, str] = {}
    sent = 0
    for report in pending:
        try:
            if report.organization_id not in customers:
                customers[report.organization_id] = ensure_customer(
                    organization=report.organization
                )
            client.v1.billing.meter_events.create(
                params={
                    "event_name": settings.STRIPE_METER_EVENT_NAME,
                    "identifier": report.identifier,
                    "timestamp": int(report.timestamp.timestamp()),
                    "payload": {
                        "stripe_customer_id": customers[report.organization_id],
                        "value": str(report.value_micro),
                    },
                },
                options={"idempotency_key": f"spur-meter-{report.identifier}"},
            )
        except (stripe.StripeError, PaymentProviderError) as exc:
            log.warning("stripe: meter event %s not sent: %s", report.identifier, exc)
            continue
        with transaction.atomic():
            sent += MeterEventReport.objects.filter(pk=report.pk, reported_at__isnull=True).update(
                reported_at=timezone.now()
            )
    return sent


def report_usage(*, now: datetime | None = None, limit: int = 1000) -> int:
    """Claims the records due and sends what is claimed (the beat task's work)."""
    claim_records(now=now, limit=limit)
    return send_claimed(limit=limit)


__all__ = ["claim_records", "event_identifier", "report_usage", "send_claimed"]
