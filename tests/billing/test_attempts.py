"""A job's attempts: a requeued job costs its whole time floored once, exactly, across
its attempts, however its events arrive; a preempted one is charged up to its
preemption; an attempt whose events come after a later one's is closed at once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from spurcloud.billing.ledger import open_account
from spurcloud.billing.metering import meter_job_event, meter_job_events, meter_open_runs
from spurcloud.billing.models import BillingAccount, LedgerEntry, MeteredRun, UsageRecord
from tests.billing.conftest import T0, Tenant, job_event

pytestmark = pytest.mark.django_db

SIGNUP = 10_000_000
# 3,661 s on 2 GPUs at 2.50 per GPU-hour: floor(2.5 × 2 × 3661 / 3600 × 10⁶).
EXACT = 5_084_722


def _balance(tenant: Tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro


def _requeued(first_s: int = 1000, gap_s: int = 500, total_s: int = 3661) -> list[dict[str, Any]]:
    """Attempt 1 runs `first_s`, is requeued (scontrol requeue: SIGTERM, its end, then
    pending again), and attempt 2 runs the rest of `total_s` after `gap_s`."""
    second = first_s + gap_s
    end = second + total_s - first_s
    return [
        job_event(when=0, state="RUNNING", start=0),
        job_event(when=first_s, state="COMPLETING", start=0, end=first_s),
        job_event(when=first_s + 2, state="PENDING", attempt=1),
        job_event(when=second, state="RUNNING", attempt=2, start=second),
        job_event(when=end, state="COMPLETED", attempt=2, start=second, end=end),
    ]


def _runs() -> list[MeteredRun]:
    return list(MeteredRun.objects.filter(job_id=7).order_by("attempt"))


def test_a_requeued_job_of_3661_seconds_costs_exactly_its_price(acme: Tenant, prices: Any) -> None:
    open_account(organization=acme.organization)
    meter_job_events(events=_requeued())
    runs = _runs()
    assert [(r.attempt, r.ended_at - r.started_at) for r in runs] == [
        (1, timedelta(seconds=1000)),
        (2, timedelta(seconds=2661)),
    ]
    # 1.3888…8 and 3.6958…3: floored apiece they would lose a micro-unit (5,084,721);
    # attempt 2 goes on from the fraction attempt 1 left.
    assert [r.charged_micro for r in runs] == [1_388_888, 3_695_834]
    assert sum(r.charged_micro for r in runs) == EXACT
    assert _balance(acme) == SIGNUP - EXACT


def test_the_exact_figure_holds_metered_event_by_event_and_tick_by_tick(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    events = _requeued()
    meter_job_event(event=events[0])
    for second in range(60, 1000, 60):
        meter_open_runs(now=T0 + timedelta(seconds=second))
    for event in events[1:4]:
        meter_job_event(event=event)
    for second in range(1560, 4161, 60):
        meter_open_runs(now=T0 + timedelta(seconds=second))
    meter_job_event(event=events[4])
    assert sum(r.charged_micro for r in _runs()) == EXACT
    assert sum(UsageRecord.objects.values_list("amount_micro", flat=True)) == EXACT
    assert _balance(acme) == SIGNUP - EXACT


def test_a_second_attempt_charged_past_its_end_is_rewritten_from_the_carried_fraction(
    acme: Tenant, prices: Any
) -> None:
    open_account(organization=acme.organization)
    events = _requeued()
    meter_job_events(events=events[:4])
    meter_open_runs(now=T0 + timedelta(seconds=4300))  # the end is late
    meter_job_events(events=events[4:])
    assert sum(r.charged_micro for r in _runs()) == EXACT
    assert _balance(acme) == SIGNUP - EXACT
    assert LedgerEntry.objects.filter(kind="refund").count() == 1


def test_replayed_and_duplicated_attempts_charge_nothing_more(acme: Tenant, prices: Any) -> None:
    open_account(organization=acme.organization)
    events = _requeued()
    meter_job_events(events=events)
    entries = LedgerEntry.objects.count()
    for event in reversed(events):
        assert meter_job_event(event=event) == 0
    meter_job_events(events=events + events)
    meter_open_runs(now=T0 + timedelta(hours=5))
    assert sum(r.charged_micro for r in _runs()) == EXACT
    assert (_balance(acme), LedgerEntry.objects.count()) == (SIGNUP - EXACT, entries)


def test_an_attempt_whose_events_come_after_the_next_ones_is_closed_at_once(
    acme: Tenant, prices: Any
) -> None:
    """Attempt 1's end reaches metering only after attempt 2 started (another batch was
    slower): it is charged up to its end, closed, and never left open for the tick to
    charge on. Its fraction is its own (attempt 2 went on from nothing), so the job may
    be a micro-unit short of its exact price, never over it."""
    open_account(organization=acme.organization)
    events = _requeued()
    meter_job_event(event=events[3])  # attempt 2 starts
    meter_job_event(event=events[1])  # attempt 1's end, late
    meter_job_event(event=events[0])  # and its start, later still: nothing more
    first, second = _runs()
    assert first.ended_at == T0 + timedelta(seconds=1000)
    assert first.charged_micro == 1_388_888
    meter_open_runs(now=T0 + timedelta(seconds=4161))
    meter_job_events(events=events)
    assert _runs()[0].charged_micro == 1_388_888
    assert sum(r.charged_micro for r in _runs()) == EXACT - 1
    assert _balance(acme) == SIGNUP - (EXACT - 1)


def test_a_late_start_of_an_earlier_attempt_is_charged_only_what_it_shows(
    acme: Tenant, prices: Any
) -> None:
    """All that is known of attempt 1 is a start event arriving after attempt 2's: it
    ran from its start to at least that event; metering charges no more than that."""
    open_account(organization=acme.organization)
    meter_job_event(event=job_event(when=1500, state="RUNNING", attempt=2, start=1500))
    meter_job_event(event=job_event(when=600, state="RUNNING", start=0))
    meter_open_runs(now=T0 + timedelta(seconds=3000))
    first, second = _runs()
    assert (first.ended_at, first.charged_micro) == (T0 + timedelta(seconds=600), 833_333)
    assert second.ended_at is None and second.charged_micro == 2_083_333  # 1,500 s


def test_a_preempted_spot_job_is_charged_at_the_spot_price_up_to_its_preemption(
    acme: Tenant, prices: Any
) -> None:
    """Preemption SIGTERMs the job (COMPLETING, its end time) and, after its grace, ends
    it PREEMPTED or requeues it: the grace is not charged; a requeued attempt is."""
    open_account(organization=acme.organization)
    spot = {"qos": "spot"}
    meter_job_events(
        events=[
            job_event(8, when=0, state="RUNNING", start=0, **spot),
            job_event(8, when=1800, state="COMPLETING", start=0, end=1800, **spot),
            job_event(8, when=1830, state="PREEMPTED", start=0, end=1830, **spot),
            job_event(9, when=0, state="RUNNING", start=0, **spot),
            job_event(9, when=1800, state="COMPLETING", start=0, end=1800, **spot),
            job_event(9, when=1830, state="PENDING", attempt=1, **spot),
            job_event(9, when=2400, state="RUNNING", attempt=2, start=2400, **spot),
        ]
    )
    meter_open_runs(now=T0 + timedelta(seconds=4200))
    preempted = MeteredRun.objects.get(job_id=8)
    assert (preempted.qos_class, preempted.ended_at) == ("spot", T0 + timedelta(seconds=1800))
    assert preempted.charged_micro == 1_000_000  # half an hour, 2 GPUs, 1.00 each
    requeued = list(MeteredRun.objects.filter(job_id=9).order_by("attempt"))
    assert [r.ended_at is None for r in requeued] == [False, True]
    assert [r.charged_micro for r in requeued] == [1_000_000, 1_000_000]
    assert _balance(acme) == SIGNUP - 3_000_000
