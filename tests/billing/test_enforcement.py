"""Credit runs out: a warning below the threshold, 402 on submit at zero (API,
slurmrestd's route, sbatch through the API), and running work stopped after the grace
period; a top-up restores service. Against a real controller and the Stripe fake."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from spurcloud.billing import tasks
from spurcloud.billing.ledger import open_account, post_entry
from spurcloud.billing.metering import meter_job_events, meter_open_runs
from spurcloud.billing.models import BillingAccount, LedgerEntry, PriceEntry, QosClass
from spurcloud.billing.services import organizations_past_grace, set_billing_mode
from spurcloud.jobs.models import JobRecord
from tests.billing.conftest import T0, Tenant, job_event
from tests.billing.test_stripe import _deliver, _top_up
from tests.fixtures.stripe_fake import FakeStripe

pytestmark = pytest.mark.django_db
SCRIPT = "#!/bin/sh\nsleep 600\n"


def _use_up(tenant: Tenant) -> None:
    account = open_account(organization=tenant.organization)
    post_entry(
        organization=tenant.organization,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micro=-account.balance_micro,
        description="test: nothing left",
    )


def _submit(client: APIClient) -> Any:
    # 10 minutes: an estimate (price x GPUs x time limit) the balance covers.
    job = {"script": SCRIPT, "gpus_per_node": 1, "time_limit_min": 10}
    return client.post("/api/v1/jobs", job, format="json")


def test_a_submission_at_zero_balance_is_refused_with_402_and_says_why(
    acme: Tenant, as_member: APIClient
) -> None:
    _use_up(acme)
    response = _submit(as_member)
    assert response.status_code == 402
    body = response.json()
    assert body["code"] == "payment_required"
    assert "prepaid credit is used up" in body["detail"] and "Top up" in body["detail"]
    assert not JobRecord.objects.exists()


@pytest.mark.parametrize("mode", ["postpaid", "exempt"])
def test_invoiced_and_exempt_organisations_are_not_refused_at_zero(
    acme: Tenant, as_member: APIClient, mode: str
) -> None:
    _use_up(acme)
    set_billing_mode(organization=acme.organization, mode=mode)
    # Past the credit check: the (absent) controller answers now.
    assert _submit(as_member).status_code == 503


def test_a_new_organisation_opens_with_its_sign_up_credit_once(acme: Tenant) -> None:
    open_account(organization=acme.organization)
    open_account(organization=acme.organization)
    account = BillingAccount.objects.get(organization=acme.organization)
    assert (account.mode, account.balance_micro) == ("prepaid", 10_000_000)
    assert LedgerEntry.objects.filter(kind="promotion").count() == 1


def test_owners_are_warned_once_when_credit_runs_low(
    acme: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    open_account(organization=acme.organization)
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(3):
            post_entry(
                organization=acme.organization, kind=LedgerEntry.Kind.ADJUSTMENT,
                amount_micro=-2_000_000,
            )  # fmt: skip
    assert len(mail.outbox) == 1
    assert "credit is low" in mail.outbox[0].subject
    assert mail.outbox[0].to == [acme.owner.email]


def test_the_grace_period_runs_from_when_the_balance_reached_zero(
    acme: Tenant, settings: Any
) -> None:
    settings.BILLING_GRACE_S = 600
    _use_up(acme)
    assert organizations_past_grace() == []
    later = timezone.now() + timedelta(seconds=601)
    assert organizations_past_grace(now=later) == [acme.organization]
    post_entry(organization=acme.organization, kind=LedgerEntry.Kind.PROMOTION, amount_micro=1)
    assert organizations_past_grace(now=later) == []


def test_end_to_end_credit_runs_out_the_job_is_stopped_and_a_top_up_restores_service(
    acme: Tenant,
    as_owner: APIClient,
    as_member: APIClient,
    live_controller: Any,
    stripe_fake: FakeStripe,
    eager_celery: Any,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
) -> None:
    settings.BILLING_GRACE_S = 0
    PriceEntry.objects.create(
        gpu_model="", qos_class=QosClass.ON_DEMAND, effective_from=T0 - timedelta(days=30),
        gpu_hour_micro=36_000_000,  # 0.01 a GPU-second
    )  # fmt: skip
    submitted = _submit(as_member)
    assert submitted.status_code == 201, submitted.json()
    job_id = submitted.json()["job_id"]
    # The controller's events: it started (one GPU) and runs; the tick meters it.
    started = job_event(job_id, when=0, state="RUNNING", start=0, gpu_milli=1000)
    started["job"]["gpu_type"] = ""
    meter_job_events(events=[started])
    meter_open_runs(now=T0 + timedelta(seconds=400))
    balance = as_member.get("/api/v1/billing/balance").json()
    assert balance["balance_micro"] == 10_000_000 - 4_000_000
    meter_open_runs(now=T0 + timedelta(seconds=1000))  # 10.00 in all: nothing left
    assert as_member.get("/api/v1/billing/balance").json()["credit_used_up"] is True
    refused = _submit(as_member)
    assert refused.status_code == 402 and "used up" in refused.json()["detail"]
    # Past the grace period the running job is cancelled through the job service.
    assert tasks.stop_unpaid_work() == 1
    job = live_controller.client().job(job_id, tenant="acme")
    assert job["state"] in ("CANCELLED", "COMPLETING")
    # A top-up through Checkout and its webhook restore service.
    session_id = _top_up(as_owner, "20.00").json()["session_id"]
    with django_capture_on_commit_callbacks(execute=True):
        assert _deliver(stripe_fake.pay(session_id)).status_code == 200
    assert as_member.get("/api/v1/billing/balance").json()["credit_used_up"] is False
    assert _submit(as_member).status_code == 201


def test_slurmrestds_submit_is_refused_with_402_and_the_message(
    acme: Tenant, as_member: APIClient
) -> None:
    _use_up(acme)
    workdir = django_settings.SPUR_WORK_ROOT / "acme"
    response = as_member.post(
        "/slurm/v0.0.41/job/submit",
        {"job": {"script": SCRIPT, "current_working_directory": str(workdir)}},
        format="json",
    )
    assert response.status_code == 402, response.content
    errors = response.json()["errors"]
    assert "prepaid credit is used up" in errors[0]["description"]
    assert not JobRecord.objects.exists()
