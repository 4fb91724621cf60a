"""Metering from job events and the tick: exact charges, each once, whatever the order."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from spurcloud.billing.ledger import open_account
from spurcloud.billing.metering import meter_job_event, meter_job_events, meter_open_runs
from spurcloud.billing.models import (
    BillingAccount,
    LedgerEntry,
    MeteredRun,
    PriceEntry,
    QosClass,
    UsageRecord,
)
from tests.billing.conftest import T0, Tenant, job_event

pytestmark = pytest.mark.django_db

SIGNUP = 10_000_000


def _balance(tenant: Tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro


def _ledger_sum(tenant: Tenant) -> int:
    return sum(e.amount_micro for e in LedgerEntry.objects.filter(organization=tenant.organization))


def _run_3661(**extra: Any) -> list[dict[str, Any]]:
    return [
        job_event(when=0, state="RUNNING", start=0, **extra),
        job_event(when=3661, state="COMPLETED", start=0, end=3661, exit_code=0, **extra),
    ]


def test_a_job_of_3661_seconds_on_two_gpus_costs_exactly_its_price(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    meter_job_events(events=_run_3661())
    run = MeteredRun.objects.get(job_id=7)
    assert (run.gpu_milli, run.gpu_model, run.qos_class, run.attempt) == (
        2000,
        "h100",
        "on_demand",
        1,
    )
    assert run.charged_micro == 5_084_722
    assert run.ended_at == T0 + timedelta(seconds=3661)
    assert _balance(acme) == SIGNUP - 5_084_722 == _ledger_sum(acme)


def test_ticks_every_minute_charge_the_same_total_and_keep_the_balance_live(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    meter_job_events(events=[job_event(when=0, state="RUNNING", start=0)])
    for minute in range(1, 62):
        meter_open_runs(now=T0 + timedelta(minutes=minute))
        if minute == 30:
            assert _balance(acme) == SIGNUP - 2_500_000  # half an hour on two GPUs
    meter_job_events(events=[job_event(when=3661, state="COMPLETED", start=0, end=3661)])
    assert MeteredRun.objects.get(job_id=7).charged_micro == 5_084_722
    assert _balance(acme) == SIGNUP - 5_084_722 == _ledger_sum(acme)
    assert UsageRecord.objects.filter(run__job_id=7).count() == 62


def test_a_tick_that_charged_past_the_end_is_credited_back_exactly(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    meter_job_events(events=[job_event(when=0, state="RUNNING", start=0)])
    meter_open_runs(now=T0 + timedelta(seconds=3720))  # the finish event is late
    meter_job_events(events=[job_event(when=3661, state="COMPLETED", start=0, end=3661)])
    assert MeteredRun.objects.get(job_id=7).charged_micro == 5_084_722
    assert _balance(acme) == SIGNUP - 5_084_722 == _ledger_sum(acme)
    assert LedgerEntry.objects.filter(kind="refund").count() == 1


def test_a_price_change_while_it_runs_splits_its_usage_at_the_effective_date(
    acme: Tenant, prices: Any
) -> None:
    PriceEntry.objects.create(
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        effective_from=T0 + timedelta(seconds=1800),
        gpu_hour_micro=3_000_000,
    )
    open_account(organization=acme.organization)
    meter_job_events(events=_run_3661())
    records = list(UsageRecord.objects.filter(run__job_id=7).order_by("period_start"))
    assert [r.period_end - r.period_start for r in records] == [
        timedelta(seconds=1800),
        timedelta(seconds=1861),
    ]
    assert [r.price.gpu_hour_micro for r in records if r.price] == [2_500_000, 3_000_000]
    assert sum(r.amount_micro for r in records) == 5_601_666


def test_a_requeue_whose_end_was_coalesced_away_closes_at_the_requeue(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    meter_job_events(events=[job_event(when=0, state="RUNNING", start=0)])
    meter_job_events(events=[job_event(when=3600, state="PENDING", attempt=1)])
    run = MeteredRun.objects.get(job_id=7)
    assert run.ended_at == T0 + timedelta(seconds=3600)
    assert run.charged_micro == 5_000_000


def test_duplicate_reordered_and_replayed_events_charge_nothing_more(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    events = [
        job_event(when=0, state="RUNNING", start=0),
        job_event(when=1000, state="COMPLETING", start=0, end=1000),
        job_event(when=1002, state="PENDING", attempt=1),
        job_event(when=1500, state="RUNNING", attempt=2, start=1500),
        job_event(when=4161, state="COMPLETED", attempt=2, start=1500, end=4161),
    ]
    meter_job_events(events=events)
    balance, entries = _balance(acme), LedgerEntry.objects.count()
    for event in reversed(events):  # replayed, newest first, one by one
        assert meter_job_event(event=event) == 0
    meter_job_events(events=events + events)
    meter_open_runs(now=T0 + timedelta(hours=5))
    assert (_balance(acme), LedgerEntry.objects.count()) == (balance, entries)


def test_events_arriving_newest_first_charge_what_in_order_would(acme: Tenant, prices: Any) -> None:
    open_account(organization=acme.organization)
    for event in reversed(_run_3661()):
        meter_job_event(event=event)
    assert MeteredRun.objects.get(job_id=7).charged_micro == 5_084_722
    assert _balance(acme) == SIGNUP - 5_084_722


def test_a_worker_killed_mid_metering_and_retried_charges_once(acme: Tenant, prices: Any) -> None:
    open_account(organization=acme.organization)
    events = _run_3661()

    class Killed(Exception):
        pass

    with pytest.raises(Killed), transaction.atomic():
        meter_job_events(events=events)
        raise Killed  # the worker dies before its transaction commits
    assert not MeteredRun.objects.exists()
    meter_job_events(events=events)  # the broker redelivers (acks_late)
    meter_job_events(events=events)  # and once more
    assert _balance(acme) == SIGNUP - 5_084_722


def test_spot_qos_uses_the_spot_price_and_an_unknown_model_the_default(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    meter_job_events(
        events=[
            job_event(8, when=0, state="RUNNING", start=0, qos="spot"),
            job_event(8, when=3600, state="COMPLETED", start=0, end=3600, qos="spot"),
        ]
    )
    events = [
        job_event(9, when=0, state="RUNNING", start=0),
        job_event(9, when=3600, state="COMPLETED", start=0, end=3600),
    ]
    for event in events:
        event["job"]["gpu_type"] = "mi300x"
    meter_job_events(events=events)
    charged = dict(MeteredRun.objects.values_list("job_id", "charged_micro"))
    assert charged == {8: 2_000_000, 9: 3_600_000}


def test_an_exempt_organisation_has_usage_but_no_debits(acme: Tenant, prices: Any) -> None:
    account = open_account(organization=acme.organization)
    BillingAccount.objects.filter(pk=account.pk).update(mode="exempt")
    meter_job_events(events=_run_3661())
    assert UsageRecord.objects.filter(organization=acme.organization).exists()
    assert _balance(acme) == SIGNUP
    assert not LedgerEntry.objects.filter(kind="usage").exists()


def test_events_of_another_organisation_never_touch_this_ones_balance(
    acme: Tenant, globex: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    open_account(organization=globex.organization)
    meter_job_events(events=_run_3661(job_id=8, tenant="globex"))
    assert _balance(acme) == SIGNUP
    assert _balance(globex) == SIGNUP - 5_084_722
    # An event that names another tenant for acme's job changes neither.
    meter_job_events(events=[job_event(when=0, state="RUNNING", start=0)])
    meter_job_events(
        events=[job_event(when=100, state="COMPLETED", start=0, end=100, tenant="globex")]
    )
    assert MeteredRun.objects.get(job_id=7).ended_at is None
    assert _balance(globex) == SIGNUP - 5_084_722


def test_the_job_events_task_mirrors_and_meters_in_one_go(acme: Tenant, prices: Any) -> None:
    from spurcloud.jobs.models import JobRecord
    from spurcloud.jobs.tasks import job_events

    open_account(organization=acme.organization)
    job_events(_run_3661())
    assert JobRecord.objects.get(job_id=7).state == "COMPLETED"
    assert _balance(acme) == SIGNUP - 5_084_722


def test_a_malformed_event_is_skipped_and_holds_no_other_back(
    acme: Tenant, prices: Any, caplog: pytest.LogCaptureFixture
) -> None:
    open_account(organization=acme.organization)
    bad = job_event(8, when=0, state="RUNNING", start=0)
    bad["job"]["state"] = "BOOT_FAIL"  # a Slurm state Spur never gives
    worse = job_event(9, when=0, state="RUNNING", start=0)
    del worse["job"]["job_id"]
    meter_job_events(events=[bad, worse, *_run_3661()])
    assert list(MeteredRun.objects.values_list("job_id", flat=True)) == [7]
    assert _balance(acme) == SIGNUP - 5_084_722
    assert "could not be metered" in caplog.text


def test_a_batch_the_database_refuses_is_metered_event_by_event(acme: Tenant, prices: Any) -> None:
    open_account(organization=acme.organization)
    broken = job_event(8, when=0, state="RUNNING", start=0)
    broken["job"]["gpu_milli"] = -5  # the database refuses a negative capacity
    meter_job_events(events=[broken, *_run_3661()])
    assert list(MeteredRun.objects.values_list("job_id", flat=True)) == [7]
    assert _balance(acme) == SIGNUP - 5_084_722


def test_the_records_a_tick_writes_carry_each_field_of_what_it_charged(
    acme: Tenant, prices: Any
) -> None:
    """The tick writes its records in one statement (PostgreSQL's unnest): each field as
    charged, its run's and its price's ids, its period and its exact amount."""
    open_account(organization=acme.organization)
    meter_job_events(events=[job_event(when=0, state="RUNNING", start=0)])
    meter_open_runs(now=T0 + timedelta(minutes=1))
    meter_open_runs(now=T0 + timedelta(minutes=2, seconds=30))
    run = MeteredRun.objects.get(job_id=7)
    on_demand = PriceEntry.objects.get(gpu_model="h100", qos_class=QosClass.ON_DEMAND)
    rows = list(
        UsageRecord.objects.filter(run=run).values_list(
            "organization_id", "period_start", "period_end", "gpu_model", "qos_class",
            "gpu_milli_seconds", "price_id", "amount_micro",
        )
    )  # fmt: skip
    org = acme.organization.pk
    assert rows == [
        (org, T0, T0 + timedelta(minutes=1), "h100", "on_demand", 120_000, on_demand.pk,
         83_333),
        (org, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2, seconds=30), "h100",
         "on_demand", 180_000, on_demand.pk, 125_000),
    ]  # fmt: skip
    assert run.charged_micro == 83_333 + 125_000 == SIGNUP - _balance(acme)


def _jobs_of(tenant: str, first_job: int) -> list[dict[str, Any]]:
    """Four jobs' events, oldest first: one run to its end, one requeued and run again,
    one still running, one on the spot QoS; and one that failed as it started."""
    a, b, c, d, e = range(first_job, first_job + 5)
    return [
        job_event(a, when=0, state="RUNNING", start=0, tenant=tenant),
        job_event(b, when=10, state="RUNNING", start=10, tenant=tenant),
        job_event(d, when=20, state="RUNNING", start=20, qos="spot", tenant=tenant),
        job_event(e, when=30, state="FAILED", start=30, end=30, tenant=tenant),
        job_event(d, when=1220, state="COMPLETED", start=20, end=1220, qos="spot", tenant=tenant),
        job_event(b, when=700, state="PENDING", attempt=1, tenant=tenant),
        job_event(c, when=800, state="RUNNING", start=800, tenant=tenant),
        job_event(b, when=900, state="RUNNING", attempt=2, start=900, tenant=tenant),
        job_event(a, when=3661, state="COMPLETED", start=0, end=3661, tenant=tenant),
        job_event(b, when=4000, state="COMPLETED", attempt=2, start=900, end=4000, tenant=tenant),
        job_event(c, when=5000, state="RUNNING", start=800, tenant=tenant),
    ]


def test_a_batch_charges_what_its_events_charge_one_by_one(
    acme: Tenant, globex: Tenant, prices: Any
) -> None:
    """A batch is metered in one transaction of bulk writes; each of its events in a
    batch of its own charges the same runs, records and balance, to the micro-unit."""
    open_account(organization=acme.organization)
    open_account(organization=globex.organization)
    meter_job_events(events=_jobs_of("acme", 100))
    for event in _jobs_of("globex", 200):
        meter_job_events(events=[event])

    def runs(first_job: int) -> list[tuple[Any, ...]]:
        return [
            (job_id - first_job, *rest)
            for job_id, *rest in MeteredRun.objects.filter(
                job_id__gte=first_job, job_id__lt=first_job + 5
            )
            .order_by("job_id", "attempt")
            .values_list(
                "job_id", "attempt", "qos_class", "started_at", "ended_at", "metered_until",
                "charged_micro", "remainder", "carried_remainder",
            )
        ]  # fmt: skip

    def records(first_job: int) -> list[tuple[Any, ...]]:
        return [
            (job_id - first_job, *rest)
            for job_id, *rest in UsageRecord.objects.filter(
                run__job_id__gte=first_job, run__job_id__lt=first_job + 5
            )
            .order_by("run__job_id", "run__attempt", "period_start")
            .values_list(
                "run__job_id", "run__attempt", "period_start", "period_end",
                "gpu_milli_seconds", "price_id", "amount_micro",
            )
        ]  # fmt: skip

    assert runs(100) == runs(200) and len(runs(100)) == 5  # b twice; e held nothing
    assert records(100) == records(200)
    assert SIGNUP - _balance(acme) == SIGNUP - _balance(globex) > 0
    assert (_balance(acme), _balance(globex)) == (_ledger_sum(acme), _ledger_sum(globex))
