"""Metering's many-row writes: the embedded platform's statements (one prepared statement
run for every row, on SQLite) write what PostgreSQL's arrays write, to the microsecond
and the micro-unit, nulls included."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from spurcloud.billing import bulk
from spurcloud.billing.models import MeteredRun, QosClass, UsageRecord
from tests.billing.conftest import T0, Tenant

pytestmark = pytest.mark.django_db

RUN_FIELDS = ["metered_until", "charged_micro", "remainder", "ended_at"]


def _arrays_here() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's array statements are what the others are checked against")


def _runs(tenant: Tenant, first_job: int) -> list[MeteredRun]:
    return [
        MeteredRun.objects.create(
            cluster="spur",
            job_id=first_job + i,
            attempt=1,
            organization=tenant.organization,
            gpu_model="h100",
            qos_class=QosClass.ON_DEMAND,
            gpu_milli=2000,
            started_at=T0,
            metered_until=T0,
        )
        for i in range(3)
    ]


def _charged(runs: list[MeteredRun]) -> list[MeteredRun]:
    """New values for each run: a microsecond, a sum past 32 bits, a negative, a null."""
    for i, run in enumerate(runs):
        run.metered_until = T0 + timedelta(seconds=61 * i, microseconds=7)
        run.charged_micro = 2**40 + i
        run.remainder = -i
        run.ended_at = None if i == 1 else T0 + timedelta(hours=1 + i, microseconds=1)
    return runs


def _stored(first_job: int) -> list[tuple[Any, ...]]:
    return list(
        MeteredRun.objects.filter(job_id__gte=first_job, job_id__lt=first_job + 3)
        .order_by("job_id")
        .values_list(*RUN_FIELDS)
    )


def test_runs_written_row_by_row_are_what_the_arrays_write(acme: Tenant) -> None:
    _arrays_here()
    bulk._update_from_arrays(MeteredRun, _charged(_runs(acme, 100)), RUN_FIELDS)
    bulk._update_each(MeteredRun, _charged(_runs(acme, 200)), RUN_FIELDS)
    assert _stored(100) == _stored(200)
    assert _stored(200)[1][3] is None and _stored(200)[0][1] == 2**40


def test_records_inserted_row_by_row_are_what_the_arrays_insert(acme: Tenant) -> None:
    _arrays_here()
    org = acme.organization.pk

    def columns(runs: list[MeteredRun]) -> dict[str, list[Any]]:
        return {
            "run_id": [r.pk for r in runs],
            "organization_id": [org] * 3,
            "period_start": [T0 + timedelta(microseconds=i) for i in range(3)],
            "period_end": [T0 + timedelta(minutes=1 + i) for i in range(3)],
            "gpu_model": ["h100", "", "mi300x"],
            "qos_class": [QosClass.ON_DEMAND, QosClass.SPOT, QosClass.ON_DEMAND],
            "gpu_milli_seconds": [2**40, 0, 1],
            "price_id": [None] * 3,
            "amount_micro": [5_084_722, 0, 2**35],
        }

    bulk._insert_from_arrays(UsageRecord, columns(_runs(acme, 100)))
    bulk._insert_each(UsageRecord, columns(_runs(acme, 200)))

    def stored(first_job: int) -> list[tuple[Any, ...]]:
        return list(
            UsageRecord.objects.filter(run__job_id__gte=first_job, run__job_id__lt=first_job + 3)
            .order_by("run__job_id")
            .values_list(*[name for name in columns([]) if name != "run_id"])
        )

    assert stored(100) == stored(200)
    assert len(stored(200)) == 3


def test_inserted_objects_are_the_rows_bulk_create_writes(acme: Tenant) -> None:
    """The submission's records and audit events (`insert_objects`): what Django's
    bulk_create writes, and on a taken key only the columns asked for change."""
    from spurcloud.jobs.models import JobRecord
    from spurcloud.tenants.models import AuditEvent

    def record(job_id: int, **fields: Any) -> JobRecord:
        made: dict[str, Any] = {
            "name": "train", "state": "PENDING", "submit_time": T0, "nodes": ["gpu01"],
            "allocation": {"gpu01": {"gpus": [0, 1]}}, "spec": {"script": "x", "nice": -1},
        }  # fmt: skip
        made.update(fields)
        return JobRecord(
            cluster="spur", job_id=job_id, organization=acme.organization, user="max", **made
        )

    JobRecord.objects.bulk_create([record(1), record(2)])
    bulk.insert_objects(JobRecord, [record(3), record(4, time_limit_min=5)])
    mine, django = (
        [dict(row, id=0, job_id=0, created_at=0, updated_at=0)
         for row in JobRecord.objects.filter(job_id__in=ids).order_by("job_id").values()]
        for ids in ((3, 4), (1, 2))
    )  # fmt: skip
    assert mine[0] == django[0] and mine[1] == dict(django[1], time_limit_min=5)
    # A key taken: the new row's spec replaces the old one's, and nothing else changes.
    before = JobRecord.objects.values().get(job_id=3)
    bulk.insert_objects(
        JobRecord,
        [record(3, name="other", spec={"script": "y"}), record(5)],
        unique=["cluster", "job_id"],
        update=["spec"],
    )
    after = JobRecord.objects.values().get(job_id=3)
    assert after == dict(before, spec={"script": "y"})
    assert JobRecord.objects.filter(job_id=5).exists()
    event = AuditEvent(organization=acme.organization, action="job.submitted", target="3",
                       data={"name": "train"})  # fmt: skip
    bulk.insert_objects(AuditEvent, [event])
    assert AuditEvent.objects.filter(target="3").values_list("data", "action").get() == (
        {"name": "train"}, "job.submitted",
    )  # fmt: skip
