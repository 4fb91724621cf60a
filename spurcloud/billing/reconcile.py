"""Reconciliation: open runs against the job history.

Metering trusts the job events. If the event that ended a run never reached metering
(its batch failed for good, or it was lost), the tick would charge the run forever.
Once a day (`spur.billing.reconcile_runs`, and after a restore) the open runs are
checked against the job history (`jobs.JobRecord`, which the same events keep, and
whose mirror is idempotent): a run whose job is over, pending again, or on a later
attempt is metered from the record as from its event, closing it at the record's end.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduler.core.contract import HOLDS_RESOURCES, JobState
from spurcloud.billing.metering import JobEvent, meter_parsed_events
from spurcloud.billing.models import MeteredRun

log = logging.getLogger(__name__)


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.astimezone(UTC).timestamp()


def reconcile_open_runs(*, now: datetime | None = None) -> int:
    """Closes the open runs whose job the history shows over; returns how many."""
    from spurcloud.jobs.models import JobRecord  # jobs calls billing on submit

    now = now or timezone.now()
    cluster = settings.SPUR_CLUSTER_NAME
    open_runs = MeteredRun.objects.filter(cluster=cluster, ended_at__isnull=True)
    records = {
        r.job_id: r
        for r in JobRecord.objects.filter(
            cluster=cluster, job_id__in=open_runs.values("job_id")
        ).select_related("organization")
    }
    closed = 0
    for run in open_runs.order_by("pk"):
        record = records.get(run.job_id)
        if record is None:
            continue
        state = JobState(record.state)
        over = state not in HOLDS_RESOURCES or record.attempt > run.attempt
        if not over or record.organization_id != run.organization_id:
            continue
        job = {
            "job_id": record.job_id,
            "tenant": record.organization.slug,
            "state": record.state,
            "attempt": record.attempt,
            "start_time": _epoch(record.start_time),
            "end_time": _epoch(record.end_time),
            # What a later attempt's run holds, should this open it.
            "gpu_type": (record.spec or {}).get("gpu_type", ""),
            "qos": record.qos,
            "gpu_milli": record.gpu_milli,
            "num_cpus": record.num_cpus,
            "allocation": record.allocation,
        }
        at = record.end_time or record.updated_at or now
        event = JobEvent(
            seq=record.last_seq,
            tenant=record.organization.slug,
            job_id=record.job_id,
            attempt=record.attempt,
            state=state,
            start=record.start_time,
            end=record.end_time,
            at=min(at, now),
            job=job,
        )
        with transaction.atomic():
            meter_parsed_events([event], {record.organization.slug: record.organization})
        if MeteredRun.objects.filter(pk=run.pk, ended_at__isnull=False).exists():
            closed += 1
            log.warning(
                "job %s attempt %s: its end never reached metering; closed from the history",
                run.job_id,
                run.attempt,
            )
    return closed
