"""Reconciliation closes runs whose end never reached metering, from the job history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from spurcloud.billing.ledger import open_account
from spurcloud.billing.metering import meter_job_events, meter_open_runs
from spurcloud.billing.models import BillingAccount, MeteredRun
from spurcloud.billing.reconcile import reconcile_open_runs
from spurcloud.jobs.services import record_job_events
from tests.billing.conftest import T0, Tenant, job_event

pytestmark = pytest.mark.django_db


def test_a_run_whose_finish_event_was_lost_is_closed_from_the_history(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    started = job_event(when=0, state="RUNNING", start=0)
    record_job_events(events=[started])
    meter_job_events(events=[started])
    # The finish reached the history but not metering; the tick charged on past it.
    record_job_events(events=[job_event(when=3661, state="COMPLETED", start=0, end=3661)])
    meter_open_runs(now=T0 + timedelta(hours=3))
    assert reconcile_open_runs(now=T0 + timedelta(hours=3)) == 1
    run = MeteredRun.objects.get(job_id=7)
    assert run.ended_at == T0 + timedelta(seconds=3661)
    assert run.charged_micro == 5_084_722
    balance = BillingAccount.objects.get(organization=acme.organization).balance_micro
    assert balance == 10_000_000 - 5_084_722
    # Nothing more to do the second time; the tick leaves it alone.
    assert reconcile_open_runs(now=T0 + timedelta(hours=4)) == 0
    assert meter_open_runs(now=T0 + timedelta(hours=4)) == 0


def test_a_running_job_is_left_open(acme: Tenant, prices: Any) -> None:
    open_account(organization=acme.organization)
    started = job_event(when=0, state="RUNNING", start=0)
    record_job_events(events=[started])
    meter_job_events(events=[started])
    assert reconcile_open_runs(now=T0 + timedelta(hours=1)) == 0
    assert MeteredRun.objects.get(job_id=7).ended_at is None
