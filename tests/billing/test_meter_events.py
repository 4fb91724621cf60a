"""Stripe Billing Meter events for invoiced organisations, through the real `stripe`
library against the local fake (which counts an identifier once, as Stripe does): each
finished usage record is reported once, with an identifier derived from its key; a
retried report, or one resent after a worker died before marking it, counts nothing
twice; prepaid usage, usage from before the organisation became invoiced and open runs
are not reported."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import stripe
from django.conf import settings as django_settings

from spurcloud.billing import tasks
from spurcloud.billing.meter_events import claim_records, report_usage, send_claimed
from spurcloud.billing.metering import meter_job_events, meter_open_runs
from spurcloud.billing.models import BillingAccount, MeterEventReport, PriceEntry, UsageRecord
from spurcloud.billing.services import set_billing_mode
from tests.billing.conftest import T0, Tenant, job_event
from tests.fixtures.stripe_fake import SECRET_KEY, FakeStripe

pytestmark = pytest.mark.django_db
LATER = T0 + timedelta(days=1)  # "now" for the reports: within Stripe's 35 days


def _invoiced(tenant: Tenant) -> None:
    set_billing_mode(organization=tenant.organization, mode="postpaid")
    BillingAccount.objects.filter(organization=tenant.organization).update(
        postpaid_since=T0 - timedelta(days=1)
    )


def _run(job_id: int, seconds: int, *, tenant: str = "acme", finish: bool = True) -> None:
    events = [job_event(job_id, when=0, state="RUNNING", start=0, tenant=tenant)]
    if finish:
        events.append(
            job_event(job_id, when=seconds, state="COMPLETED", start=0, end=seconds, tenant=tenant)
        )
    meter_job_events(events=events)
    if not finish:
        meter_open_runs(now=T0 + timedelta(seconds=seconds))


def _customer(tenant: Tenant) -> str:
    return BillingAccount.objects.get(organization=tenant.organization).stripe_customer_id


def _total(stripe_fake: FakeStripe, tenant: Tenant) -> int:
    return stripe_fake.meter_total(django_settings.STRIPE_METER_EVENT_NAME, _customer(tenant))


def _usage(tenant: Tenant) -> int:
    records = UsageRecord.objects.filter(organization=tenant.organization)
    return sum(r.amount_micro for r in records)


def _meter_requests(stripe_fake: FakeStripe) -> list[dict[str, Any]]:
    return [r for r in stripe_fake.requests if r["path"] == "/v1/billing/meter_events"]


def test_an_invoiced_organisations_finished_usage_is_reported_once(
    acme: Tenant, prices: list[PriceEntry], stripe_fake: FakeStripe
) -> None:
    _invoiced(acme)
    _run(7, 3661)
    assert report_usage(now=LATER) == 1
    # 3,661 s on 2 h100 at 2.50: exactly what was charged, on the organisation's customer.
    assert _total(stripe_fake, acme) == _usage(acme) == 5_084_722
    (request,) = _meter_requests(stripe_fake)
    identifier = f"spur-spur-7-1-{int(T0.timestamp())}"
    assert request["form"]["identifier"] == identifier
    assert request["key"] == f"spur-meter-{identifier}"
    assert request["form"]["payload"]["value"] == "5084722"
    # Run again: nothing new is claimed or sent.
    assert report_usage(now=LATER) == 0
    assert len(_meter_requests(stripe_fake)) == 1


def test_a_report_resent_after_a_worker_died_before_marking_it_counts_once(
    acme: Tenant, prices: list[PriceEntry], stripe_fake: FakeStripe
) -> None:
    _invoiced(acme)
    _run(7, 3661)
    _run(8, 600)
    assert report_usage(now=LATER) == 2
    # The worker died after Stripe accepted the events, before it marked them sent.
    MeterEventReport.objects.update(reported_at=None)
    assert tasks.report_meter_events.apply().get() == 2  # the beat task, retried
    assert len(_meter_requests(stripe_fake)) == 4
    assert len(stripe_fake.meter_events) == 2
    assert _total(stripe_fake, acme) == _usage(acme)


def test_stripe_counts_an_identifier_once_even_under_another_idempotency_key(
    acme: Tenant, stripe_fake: FakeStripe
) -> None:
    client = stripe.StripeClient(SECRET_KEY, base_addresses={"api": stripe_fake.url})
    customer = client.v1.customers.create(params={"name": "x"}).id
    params: Any = {
        "event_name": "e",
        "identifier": "spur-same",
        "payload": {"stripe_customer_id": customer, "value": "5"},
    }
    for key in ("a", "b", "a"):
        client.v1.billing.meter_events.create(params=params, options={"idempotency_key": key})
    assert stripe_fake.meter_total("e", customer) == 5


def test_prepaid_earlier_and_unfinished_usage_is_not_reported(
    acme: Tenant, globex: Tenant, prices: list[PriceEntry], stripe_fake: FakeStripe
) -> None:
    _run(7, 3661, tenant="globex")  # prepaid: paid from its credit
    set_billing_mode(organization=acme.organization, mode="postpaid")  # from now on only
    _run(8, 3661)
    assert claim_records(now=LATER) == 0
    _invoiced(acme)
    _run(9, 600, finish=False)  # still running: its records may still be rewritten
    assert claim_records(now=LATER) == 1  # job 8's only
    assert claim_records(now=T0 + timedelta(days=40)) == 0  # past Stripe's 35 days
    assert send_claimed() == 1
    assert _total(stripe_fake, acme) == 5_084_722


def test_an_unreachable_stripe_leaves_the_reports_for_the_next_run(
    acme: Tenant, prices: list[PriceEntry], stripe_fake: FakeStripe, settings: Any
) -> None:
    _invoiced(acme)
    _run(7, 3661)
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"  # nothing listens there
    assert report_usage(now=LATER) == 0
    assert MeterEventReport.objects.filter(reported_at__isnull=True).count() == 1
    settings.STRIPE_API_BASE = stripe_fake.url
    assert send_claimed() == 1
    assert _total(stripe_fake, acme) == 5_084_722
