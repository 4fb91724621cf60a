"""Metering: from the controller's job events and a periodic tick to usage records and
ledger debits.

A job event carries the whole job (the contract's job object), and the controller
coalesces events (the newest per job in a batch), so metering reads the job's state,
never the event's kind: an attempt with a start time is a run (`MeteredRun`, unique by
job and attempt); its end time, once known, closes it; a later attempt, or the job
pending or over without a start, closes the runs before it. A run whose end never
arrived (coalesced away) is closed at the event that shows it pending again (when its
resources were released), else where it was charged up to: never beyond what is known
to have run. A tick that charged past an end it had not heard of yet is credited back
exactly when the end arrives (`_close`).

Every run is charged from `metered_until` onwards only, and `metered_until` moves in
the same transaction as the usage it charges, under the run's row lock: duplicate,
reordered or replayed events, and a worker killed mid-way and retried, charge nothing
twice.

Both a batch of events and a tick work in bulk, one transaction each (a tick: per
group of organisations): lock the runs (one SELECT ... FOR UPDATE, ordered by id),
insert new runs (ordered by job and attempt), charge in memory, write the runs back in
one UPDATE, insert the usage records, then post one ledger entry per organisation
(accounts locked in organisation order, ledger.post_entries). Every writer takes its
locks in that order, so none waits on another in a cycle.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.db.models import Max
from django.utils import timezone

from scheduler.core.contract import HOLDS_RESOURCES, JobState
from spurcloud.billing import bulk, pricing
from spurcloud.billing.ledger import Posting, post_entries
from spurcloud.billing.models import (
    Invoice,
    LedgerEntry,
    MeteredRun,
    PriceEntry,
    QosClass,
    UsageRecord,
)
from spurcloud.tenants.models import Organization

log = logging.getLogger(__name__)

PriceBook = dict[tuple[str, str], list[pricing.Price]]
TICK_ORGANIZATIONS = 50  # organisations per tick transaction (bounds how long it locks)


def qos_class(qos: str) -> QosClass:
    return QosClass.SPOT if qos in settings.BILLING_SPOT_QOS else QosClass.ON_DEMAND


def load_price_book() -> PriceBook:
    """Every price, by (GPU model, QoS class), oldest first. Read for each event batch
    (a new price applies from the next one), as rows rather than model instances."""
    book: PriceBook = defaultdict(list)
    rows = PriceEntry.objects.order_by("effective_from", "id").values_list(
        "gpu_model", "qos_class", "id", "effective_from",
        "gpu_hour_micro", "cpu_hour_micro", "mem_gb_hour_micro",
    )  # fmt: skip
    for gpu_model, qos, pk, since, gpu, cpu, mem in rows:
        book[(gpu_model, qos)].append(
            pricing.Price(
                id=pk,
                effective_from=since,
                gpu_hour_micro=gpu,
                cpu_hour_micro=cpu,
                mem_gb_hour_micro=mem,
            )
        )
    return dict(book)


def prices_for(book: PriceBook, gpu_model: str, qos: str) -> list[pricing.Price]:
    """A model's own prices, else the default ("") prices of its QoS class."""
    return book.get((gpu_model, qos)) or book.get(("", qos)) or []


@dataclass(frozen=True)
class JobEvent:
    """What metering reads of a controller job event, checked before any transaction."""

    seq: int
    tenant: str
    job_id: int
    attempt: int
    state: JobState
    start: datetime | None
    end: datetime | None
    at: datetime
    job: dict[str, Any]

    @property
    def started(self) -> bool:
        return self.start is not None and self.attempt >= 1 and self.state is not JobState.PENDING

    @classmethod
    def parse(cls, event: dict[str, Any]) -> JobEvent:
        """KeyError, TypeError or ValueError for a malformed event."""
        job = event["job"]
        at = _at(event["at"])
        assert at is not None
        return cls(
            seq=int(event["seq"]),
            tenant=str(job.get("tenant") or ""),
            job_id=int(job["job_id"]),
            attempt=int(job.get("attempt") or 0),
            state=JobState(job["state"]),
            start=_at(job.get("start_time")),
            end=_at(job.get("end_time")),
            at=at,
            job=job,
        )


def _at(value: Any) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


class _Usage(NamedTuple):
    """A usage record to write (`UsageRecord`'s columns; its run's id once it is saved):
    a tuple, since a tick makes one per running job and a model instance costs ten."""

    run: MeteredRun
    organization_id: int
    period_start: datetime
    period_end: datetime
    gpu_model: str
    qos_class: str
    gpu_milli_seconds: int
    price_id: int | None
    amount_micro: int


@dataclass
class _Batch:
    """What one transaction of metering writes."""

    book: PriceBook
    organizations: dict[int, Organization]
    records: list[_Usage] = field(default_factory=list)
    changed: dict[int, MeteredRun] = field(default_factory=dict)
    charged: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    refunded: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    rewritten: dict[int, datetime] = field(default_factory=dict)  # run id -> from when
    frozen: dict[int, datetime | None] = field(default_factory=dict)

    def frozen_until(self, org_id: int) -> datetime | None:
        """The end of the organisation's last invoiced month: its usage before then is
        on an invoice, and is never rewritten (asked once per batch, and only when a
        run's metering reaches back before the current month)."""
        if org_id not in self.frozen:
            self.frozen[org_id] = Invoice.objects.filter(organization_id=org_id).aggregate(
                end=Max("period_end")
            )["end"]
        return self.frozen[org_id]

    def charge(self, run: MeteredRun, until: datetime) -> None:
        """Charges `run` from its metered_until to `until` (in memory)."""
        if run.ended_at is not None:
            until = min(until, run.ended_at)
        if until <= run.metered_until:
            return
        if run.metered_until < pricing.month_start(until):
            frozen = self.frozen_until(run.organization_id)
            if frozen is not None and run.metered_until < frozen:
                # Its start reached metering after its month was invoiced (a backlog of
                # days): charged, but on no invoice.
                log.error(
                    "job %s attempt %s: usage from %s lands in a month already invoiced",
                    run.job_id,
                    run.attempt,
                    run.metered_until,
                )
        periods, run.remainder = pricing.split(
            run.metered_until,
            until,
            held=pricing.Held(run.gpu_milli, run.cpus, run.mem_mb),
            prices=prices_for(self.book, run.gpu_model, run.qos_class),
            remainder=run.remainder,
        )
        run.metered_until = until
        for period in periods:
            run.charged_micro += period.amount_micro
            self.charged[run.organization_id] += period.amount_micro
            self.records.append(
                _Usage(
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
        self.changed[id(run)] = run

    def close(self, run: MeteredRun, end: datetime) -> None:
        """Charges `run` up to `end` and closes it there. If a tick charged it past
        `end`, it is charged again from its start, exactly, and the difference refunded
        (its usage records are rewritten; the ledger keeps the charge and the refund).
        Records of a month already invoiced are frozen: the rewrite starts at the end of
        that month, and an end inside it closes the run there (the invoice keeps what
        it billed; a credit note corrects it)."""
        if end < run.metered_until:
            org_id = run.organization_id
            before, charged_so_far = run.charged_micro, self.charged[org_id]
            restart = run.started_at
            # Only a run that began before this month can have records on an invoice.
            began_earlier = run.started_at < pricing.month_start(timezone.now())
            frozen = self.frozen_until(org_id) if began_earlier else None
            if frozen is not None and frozen > restart:
                restart = min(frozen, run.metered_until)
            self.records = [r for r in self.records if r.run is not run or r.period_start < restart]
            if run.pk is not None:  # a run new in this batch has no records stored yet
                self.rewritten[run.pk] = restart
            # Where the run stood at `restart`: the same arithmetic that charged it.
            periods, remainder = pricing.split(
                run.started_at,
                restart,
                held=pricing.Held(run.gpu_milli, run.cpus, run.mem_mb),
                prices=prices_for(self.book, run.gpu_model, run.qos_class),
                remainder=run.carried_remainder,
            )
            run.metered_until, run.remainder = restart, remainder
            run.charged_micro = sum(p.amount_micro for p in periods)
            if end < restart:
                log.warning(
                    "job %s attempt %s ended at %s, in a month already invoiced: closed at %s",
                    run.job_id,
                    run.attempt,
                    end,
                    restart,
                )
            self.charge(run, max(end, restart))
            # The rewrite is no new debit: what was charged beyond it comes back.
            self.charged[org_id] = charged_so_far
            self.refunded[org_id] += before - run.charged_micro
        else:
            self.charge(run, end)
        run.ended_at = run.metered_until
        self.changed[id(run)] = run

    def write(self) -> None:
        """Writes the runs, the usage records and one ledger entry per organisation."""
        runs = list(self.changed.values())
        for run_id, restart in sorted(self.rewritten.items()):  # rare: one query each
            UsageRecord.objects.filter(run_id=run_id, period_start__gte=restart).delete()
        bulk.update_fields(
            MeteredRun, runs, ["metered_until", "charged_micro", "remainder", "ended_at"]
        )
        _insert_records(self.records)
        postings = []
        for org_id in sorted(set(self.charged) | set(self.refunded)):
            organization = self.organizations[org_id]
            charged, refunded = self.charged.get(org_id, 0), self.refunded.get(org_id, 0)
            if charged > 0:
                postings.append(Posting(organization, LedgerEntry.Kind.USAGE, -charged, "usage"))
            if refunded > 0:
                postings.append(
                    Posting(organization, LedgerEntry.Kind.REFUND, refunded, "usage past the end")
                )
        post_entries(postings)


def _insert_records(records: Sequence[_Usage]) -> None:
    """The usage records, in one statement (`bulk.insert_columns`). Their runs are
    saved already: each record's run id is its run's."""
    run_ids = [r.run.pk for r in records]
    assert None not in run_ids, "a usage record of a run not saved yet"
    columns: dict[str, Sequence[Any]] = {"run_id": run_ids}
    for name in _Usage._fields[1:]:
        columns[name] = [getattr(r, name) for r in records]
    bulk.insert_columns(UsageRecord, columns)


def _mem_mb(job: dict[str, Any]) -> int:
    allocation = job.get("allocation") or {}
    return sum(int(node.get("mem_mb") or 0) for node in allocation.values())


def _new_run(organization: Organization, event: JobEvent, *, carried: int) -> MeteredRun:
    """A job's attempt as a run: what it holds comes from the contract's job object
    (`gpu_milli`, `num_cpus`, its allocation's memory), its model from `gpu_type`; its
    charging starts from the remainder its job's attempt before it left (`carried`)."""
    assert event.start is not None
    job = event.job
    return MeteredRun(
        cluster=settings.SPUR_CLUSTER_NAME,
        job_id=event.job_id,
        attempt=event.attempt,
        organization=organization,
        gpu_model=str(job.get("gpu_type") or "")[:64],
        qos_class=qos_class(str(job.get("qos") or "")),
        gpu_milli=int(job.get("gpu_milli") or 0),
        cpus=int(job.get("num_cpus") or 0),
        mem_mb=_mem_mb(job),
        started_at=event.start,
        metered_until=event.start,
        remainder=carried,
        carried_remainder=carried,
    )


def _carried(runs: Sequence[MeteredRun], attempt: int) -> int:
    """What the job's latest earlier attempt, ended, left uncharged: the new attempt's
    charging goes on from it, so the job is floored once across a requeue. (An earlier
    attempt whose events come after a later one's keeps its own fraction: the later run
    has carried on from before it already.)"""
    earlier = [r for r in runs if r.attempt < attempt and r.ended_at is not None]
    if not earlier or any(r.attempt > attempt for r in runs):
        return 0
    return max(earlier, key=lambda r: r.attempt).remainder


def _apply(
    batch: _Batch, runs: list[MeteredRun], event: JobEvent, organization: Organization
) -> MeteredRun | None:
    """One event over its job's runs (in memory); returns a run it starts, unsaved."""
    if any(run.organization_id != organization.pk for run in runs):
        # Job ids are the cluster's, unique across tenants: this is a confused event,
        # and it must never touch another organisation's runs.
        log.error("job %s: event for %r, but its runs are another's", event.job_id, event.tenant)
        return None
    started = event.started
    for run in runs:
        if run.ended_at is not None:
            continue
        if run.attempt < event.attempt or (run.attempt == event.attempt and not started):
            pending_again = run.attempt == event.attempt and event.state is JobState.PENDING
            batch.close(run, event.at if pending_again else run.metered_until)
    if not started:
        return None
    assert event.start is not None
    run_now = next((r for r in runs if r.attempt == event.attempt), None)
    new = None
    if run_now is None:
        if event.end is not None and event.end <= event.start:
            return None  # ended as it started (failed at launch): it held nothing
        run_now = new = _new_run(organization, event, carried=_carried(runs, event.attempt))
        runs.append(run_now)
    if run_now.ended_at is None:
        later = [r.started_at for r in runs if r.attempt > event.attempt]
        if later:
            # A stale event: a later attempt has started, so this one was over by then.
            # Closed at once, never left open for the tick to charge on.
            until = min(event.end or event.at, min(later))
            batch.close(run_now, max(until, run_now.started_at))
        elif event.state in HOLDS_RESOURCES and event.end is None:
            batch.charge(run_now, event.at)
        else:
            batch.close(run_now, event.end or event.at)
    return new


def meter_parsed_events(events: Sequence[JobEvent], organizations: dict[str, Organization]) -> int:
    """Meters events (oldest first) in the caller's transaction; returns the charge."""
    cluster = settings.SPUR_CLUSTER_NAME
    batch = _Batch(load_price_book(), {o.pk: o for o in organizations.values()})
    job_ids = sorted({e.job_id for e in events})
    by_job: dict[int, list[MeteredRun]] = defaultdict(list)
    # Lock order: runs by id (here), new runs by (job, attempt), accounts by organisation.
    for run in (
        MeteredRun.objects.select_for_update()
        .filter(cluster=cluster, job_id__in=job_ids)
        .order_by("pk")
    ):
        by_job[run.job_id].append(run)
    new_runs: list[MeteredRun] = []
    for event in events:
        new = _apply(batch, by_job[event.job_id], event, organizations[event.tenant])
        if new is not None:
            new_runs.append(new)
    # Inserted before their usage records (which need their ids), in a fixed order. A
    # run another worker inserted meanwhile is an IntegrityError: the caller redoes the
    # events one by one, and then finds that run.
    MeteredRun.objects.bulk_create(sorted(new_runs, key=lambda r: (r.job_id, r.attempt)))
    batch.write()
    return sum(batch.charged.values()) - sum(batch.refunded.values())


def _may_change(events: Iterable[JobEvent]) -> list[JobEvent]:
    """The events that can change a run: those of a job that started (in the batch), or
    of one with a run still open (an event of a job that has not started only closes its
    open runs). A job's `submitted` event then opens no transaction; one read finds the
    open runs. A job that starts in the batch keeps all its events: a later one that
    shows it pending again closes the run the batch opens (one event a batch would)."""
    events = list(events)
    started = {e.job_id for e in events if e.started}
    waiting = {e.job_id for e in events} - started
    if not waiting:
        return events
    open_runs = set(
        MeteredRun.objects.filter(
            cluster=settings.SPUR_CLUSTER_NAME, job_id__in=waiting, ended_at__isnull=True
        ).values_list("job_id", flat=True)
    )
    return [e for e in events if e.job_id in started or e.job_id in open_runs]


def meter_job_events(*, events: Iterable[dict[str, Any]]) -> int:
    """Meters a batch of controller job events, oldest first, in one transaction;
    returns the net micro-units charged. A malformed event is logged and skipped; if
    the database refuses the batch, its events are metered one by one so that one bad
    event holds no other back. A failure of the database itself propagates, for the
    task to retry the whole batch."""
    parsed: list[JobEvent] = []
    for event in events:
        try:
            parsed.append(JobEvent.parse(event))
        except (KeyError, TypeError, ValueError, AssertionError):
            log.exception("job event seq %s could not be metered; skipped", event.get("seq"))
    parsed.sort(key=lambda e: e.seq)
    organizations = {
        o.slug: o for o in Organization.objects.filter(slug__in={e.tenant for e in parsed})
    }
    known = _may_change(e for e in parsed if e.tenant in organizations)
    if not known:
        return 0
    try:
        with transaction.atomic():
            return meter_parsed_events(known, organizations)
    except (OperationalError, InterfaceError):
        raise
    except DatabaseError:
        log.warning("a batch of %s job events was refused; metering them one by one", len(known))
    total = 0
    for one in known:
        try:
            with transaction.atomic():
                total += meter_parsed_events([one], organizations)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError:
            log.exception("job %s: event seq %s could not be metered", one.job_id, one.seq)
    return total


def meter_job_event(*, event: dict[str, Any]) -> int:
    """Meters one event (see meter_job_events)."""
    return meter_job_events(events=[event])


def meter_open_runs(
    *, now: datetime | None = None, organization_ids: Sequence[int] | None = None
) -> int:
    """The tick: charges every open run up to `now`. Returns how many runs it charged."""
    now = now or timezone.now()
    open_runs = MeteredRun.objects.filter(ended_at__isnull=True, metered_until__lt=now)
    if organization_ids is not None:
        open_runs = open_runs.filter(organization_id__in=organization_ids)
    org_ids = sorted(set(open_runs.values_list("organization_id", flat=True).distinct()))
    book = load_price_book()
    charged = 0
    for i in range(0, len(org_ids), TICK_ORGANIZATIONS):
        group = org_ids[i : i + TICK_ORGANIZATIONS]
        with transaction.atomic():
            batch = _Batch(book, Organization.objects.in_bulk(group))
            runs = (
                MeteredRun.objects.select_for_update()
                .filter(organization_id__in=group, ended_at__isnull=True, metered_until__lt=now)
                .order_by("pk")
            )
            for run in runs:
                batch.charge(run, now)
                charged += 1
            batch.write()
    return charged
