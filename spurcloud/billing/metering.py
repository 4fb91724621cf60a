"""Metering: from the controller's job events and a periodic tick to usage records and
ledger debits.

A job event carries the whole job (the contract's job object), and the controller
coalesces events (the newest per job in a batch), so metering reads the job's state,
never the event's kind: an attempt with a start time is a run (`MeteredRun`, unique by
job and attempt); its end time, once known, closes it; a later attempt, or the job
pending or over without a start, closes the runs before it. A run whose end never
arrived (coalesced away) is closed at the event that shows it over: the time its
resources were released. Every run is charged from `metered_until` onwards only, and
`metered_until` moves in the same transaction as the usage it charges, under the run's
row lock: duplicate, reordered or replayed events, and a worker killed mid-way and
retried, charge nothing twice.

The tick (`meter_open_runs`, every minute) charges every open run up to now, one
organisation per transaction, so balances stay live while jobs run.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    transaction,
)
from django.utils import timezone

from scheduler.core.contract import HOLDS_RESOURCES, JobState
from spurcloud.billing import pricing
from spurcloud.billing.ledger import open_account, post_entry
from spurcloud.billing.models import (
    BillingAccount,
    LedgerEntry,
    MeteredRun,
    PriceEntry,
    QosClass,
    UsageRecord,
)
from spurcloud.tenants.models import Organization

log = logging.getLogger(__name__)

PriceBook = dict[tuple[str, str], list[pricing.Price]]


def qos_class(qos: str) -> QosClass:
    return QosClass.SPOT if qos in settings.BILLING_SPOT_QOS else QosClass.ON_DEMAND


def load_price_book() -> PriceBook:
    book: PriceBook = defaultdict(list)
    for entry in PriceEntry.objects.order_by("effective_from", "id"):
        book[(entry.gpu_model, entry.qos_class)].append(
            pricing.Price(
                id=entry.pk,
                effective_from=entry.effective_from,
                gpu_hour_micro=entry.gpu_hour_micro,
                cpu_hour_micro=entry.cpu_hour_micro,
                mem_gb_hour_micro=entry.mem_gb_hour_micro,
            )
        )
    return dict(book)


def prices_for(book: PriceBook, gpu_model: str, qos: str) -> list[pricing.Price]:
    """A model's own prices, else the default ("") prices of its QoS class."""
    return book.get((gpu_model, qos)) or book.get(("", qos)) or []


def _charge(run: MeteredRun, until: datetime, book: PriceBook) -> list[UsageRecord]:
    """Charges `run` from its metered_until to `until` (in memory; the caller saves)."""
    if run.ended_at is not None:
        until = min(until, run.ended_at)
    if until <= run.metered_until:
        return []
    held = pricing.Held(run.gpu_milli, run.cpus, run.mem_mb)
    periods, run.remainder = pricing.split(
        run.metered_until,
        until,
        held=held,
        prices=prices_for(book, run.gpu_model, run.qos_class),
        remainder=run.remainder,
    )
    run.metered_until = until
    records = []
    for period in periods:
        run.charged_micro += period.amount_micro
        records.append(
            UsageRecord(
                run=run,
                organization_id=run.organization_id,
                period_start=period.start,
                period_end=period.end,
                gpu_model=run.gpu_model,
                qos_class=run.qos_class,
                gpu_milli_seconds=period.gpu_milli_seconds,
                price_id=period.price.id if period.price else None,
                amount_micro=period.amount_micro,
            )
        )
    return records


_RUN_FIELDS = ["metered_until", "charged_micro", "remainder", "ended_at"]


def _debit(organization: Organization, amount: int, description: str) -> None:
    if amount <= 0:
        return
    account = open_account(organization=organization)
    if account.mode == BillingAccount.Mode.EXEMPT:
        return
    post_entry(
        organization=organization,
        kind=LedgerEntry.Kind.USAGE,
        amount_micro=-amount,
        description=description,
    )


def _at(value: Any) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


def _mem_mb(job: dict[str, Any]) -> int:
    allocation = job.get("allocation") or {}
    return sum(int(node.get("mem_mb") or 0) for node in allocation.values())


def meter_job_event(
    *,
    event: dict[str, Any],
    book: PriceBook | None = None,
    organization: Organization | None = None,
) -> int:
    """Meters one controller job event; returns the micro-units it charged (0 for a
    duplicate, a stale event, or a job that holds nothing)."""
    job = event["job"]
    if organization is None:
        organization = Organization.objects.filter(slug=job.get("tenant") or "").first()
        if organization is None:
            return 0
    book = load_price_book() if book is None else book
    cluster = settings.SPUR_CLUSTER_NAME
    job_id = int(job["job_id"])
    attempt = int(job.get("attempt") or 0)
    start, end, at = _at(job.get("start_time")), _at(job.get("end_time")), _at(event["at"])
    assert at is not None
    state = JobState(job["state"])
    started = start is not None and attempt >= 1 and state is not JobState.PENDING
    with transaction.atomic():
        # Lock order: this job's runs by id, then (in post_entry) the account.
        runs = list(
            MeteredRun.objects.select_for_update()
            .filter(cluster=cluster, job_id=job_id)
            .order_by("pk")
        )
        records: list[UsageRecord] = []
        changed: list[MeteredRun] = []
        refund = 0
        for run in runs:
            if run.ended_at is not None:
                continue
            # An earlier attempt, or this one when the job shows no start: the event that
            # ended it was coalesced away. A requeued job (pending again) released its
            # resources at this event; otherwise the end is unknown, and the run is closed
            # where it was charged up to, never beyond what is known to have run.
            if run.attempt < attempt or (run.attempt == attempt and not started):
                close_at = at if run.attempt == attempt and state is JobState.PENDING else None
                more, back = _close(run, close_at or run.metered_until, book)
                records += more
                refund += back
                changed.append(run)
        if started:
            assert start is not None
            run_now = next((r for r in runs if r.attempt == attempt), None)
            if run_now is None and not (end is not None and end <= start):
                # (A run that ended as it started, e.g. failed at launch, held nothing.)
                run_now = _new_run(
                    cluster=cluster,
                    organization=organization,
                    job=job,
                    attempt=attempt,
                    start=start,
                )
            if run_now is not None and run_now.ended_at is None:
                if state in HOLDS_RESOURCES and end is None:
                    records += _charge(run_now, at, book)
                else:
                    more, back = _close(run_now, end or at, book)
                    records += more
                    refund += back
                changed.append(run_now)
        if not changed:
            return 0
        MeteredRun.objects.bulk_update(changed, _RUN_FIELDS)
        UsageRecord.objects.bulk_create(records)
        amount = sum(r.amount_micro for r in records)
        _debit(organization, amount, f"job {job_id}")
        if refund:
            _credit_back(organization, refund, f"job {job_id}: charged past its end")
    return amount - refund


def _new_run(
    *, cluster: str, organization: Organization, job: dict[str, Any], attempt: int, start: datetime
) -> MeteredRun:
    """The run of a job's attempt, created (what it holds from the contract's job
    object: `gpu_milli`, `num_cpus`, its allocation's memory) or, when another worker
    created it meanwhile, that one, locked."""
    try:
        with transaction.atomic():
            return MeteredRun.objects.create(
                cluster=cluster,
                job_id=int(job["job_id"]),
                attempt=attempt,
                organization=organization,
                gpu_model=str(job.get("gpu_type") or "")[:64],
                qos_class=qos_class(str(job.get("qos") or "")),
                gpu_milli=int(job.get("gpu_milli") or 0),
                cpus=int(job.get("num_cpus") or 0),
                mem_mb=_mem_mb(job),
                started_at=start,
                metered_until=start,
            )
    except IntegrityError:
        return MeteredRun.objects.select_for_update().get(
            cluster=cluster, job_id=int(job["job_id"]), attempt=attempt
        )


def _close(run: MeteredRun, end: datetime, book: PriceBook) -> tuple[list[UsageRecord], int]:
    """Charges `run` up to `end` and closes it there; returns the new usage records and,
    when the tick had charged past `end`, what it charged too much."""
    if end >= run.metered_until:
        records = _charge(run, end, book)
        run.ended_at = run.metered_until
        return records, 0
    refund = _recharge(run, end, book)
    run.ended_at = run.metered_until
    return [], refund


def _recharge(run: MeteredRun, end: datetime, book: PriceBook) -> int:
    """Re-meters a run that was charged past its `end` from its start, exactly, and
    returns what it was charged too much. Its usage records are rewritten (they are
    the detail behind the ledger, which keeps both the charge and the refund)."""
    before = run.charged_micro
    UsageRecord.objects.filter(run=run).delete()
    run.metered_until, run.charged_micro, run.remainder = run.started_at, 0, 0
    run.ended_at = None
    UsageRecord.objects.bulk_create(_charge(run, end, book))
    return before - run.charged_micro


def _credit_back(organization: Organization, amount: int, description: str) -> None:
    account = open_account(organization=organization)
    if account.mode == BillingAccount.Mode.EXEMPT or amount <= 0:
        return
    post_entry(
        organization=organization,
        kind=LedgerEntry.Kind.REFUND,
        amount_micro=amount,
        description=description,
    )


def meter_job_events(*, events: Iterable[dict[str, Any]]) -> int:
    """Meters a batch of events, oldest first, each in its own transaction."""
    book = load_price_book()
    organizations: dict[str, Organization | None] = {}
    total = 0
    for event in sorted(events, key=lambda e: int(e["seq"])):
        slug = str(event.get("job", {}).get("tenant") or "")
        if slug not in organizations:
            organizations[slug] = Organization.objects.filter(slug=slug).first()
        organization = organizations[slug]
        if organization is None:
            continue
        try:
            total += meter_job_event(event=event, book=book, organization=organization)
        except (OperationalError, InterfaceError):
            raise  # the database itself: the batch is retried whole (the task's autoretry)
        except (DatabaseError, KeyError, TypeError, ValueError):
            # One malformed event (an unknown state, a refused row) must not hold the
            # others back; its job is charged by its next event or the tick.
            log.exception(
                "job %s: event seq %s could not be metered; skipped",
                event.get("job", {}).get("job_id"),
                event.get("seq"),
            )
    return total


def meter_open_runs(
    *, now: datetime | None = None, organization_ids: Sequence[int] | None = None
) -> int:
    """The tick: charges every open run up to `now`, one organisation per transaction.
    Returns how many runs it charged."""
    now = now or timezone.now()
    book = load_price_book()
    open_runs = MeteredRun.objects.filter(ended_at__isnull=True, metered_until__lt=now)
    if organization_ids is not None:
        open_runs = open_runs.filter(organization_id__in=organization_ids)
    org_ids = sorted(set(open_runs.values_list("organization_id", flat=True)))
    organizations = Organization.objects.in_bulk(org_ids)
    charged = 0
    for org_id in org_ids:
        with transaction.atomic():
            runs = list(
                MeteredRun.objects.select_for_update()
                .filter(organization_id=org_id, ended_at__isnull=True, metered_until__lt=now)
                .order_by("pk")
            )
            records: list[UsageRecord] = []
            for run in runs:
                records += _charge(run, now, book)
            MeteredRun.objects.bulk_update(runs, _RUN_FIELDS, batch_size=1000)
            UsageRecord.objects.bulk_create(records, batch_size=2000)
            _debit(organizations[org_id], sum(r.amount_micro for r in records), "usage")
            charged += len(runs)
    return charged
