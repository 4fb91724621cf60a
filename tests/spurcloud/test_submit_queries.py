"""What one submission costs the database, counted: the hot path of every job (the API's
POST /api/v1/jobs) must not grow a query unnoticed (an extra SELECT, a savepoint, a
read-modify-write)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from rest_framework.test import APIClient

from spurcloud.billing.models import PriceEntry, QosClass
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import AuditEvent

SPEC = {"script": "#!/bin/sh\nsleep 600\n", "hold": True}


def statements(queries: Any) -> list[str]:
    return [q["sql"].split(" ", 1)[0] for q in queries.captured_queries]


@pytest.mark.parametrize("price_book", [False, True])
def test_a_submission_reads_once_and_writes_two(
    live_controller: Any,
    as_member: APIClient,
    django_assert_num_queries: Any,
    price_book: bool,
) -> None:
    if price_book:  # what a prepaid organisation's estimate reads, joined to its account
        PriceEntry.objects.create(
            gpu_model="", qos_class=QosClass.ON_DEMAND,
            effective_from=datetime(2026, 1, 1, tzinfo=UTC), gpu_hour_micro=1_800_000,
        )  # fmt: skip
    spec = {**SPEC, "time_limit_min": 1}
    assert as_member.post("/api/v1/jobs", spec, format="json").status_code == 201  # warm
    # The token is kept from the request before (spurcloud/tenants/token_cache.py), read
    # with its user's role and confirmed address; then the billing account joined to the
    # price book (billing/quotes.py, `submit_terms`); one transaction (a savepoint inside
    # the test's own) with one INSERT of the record and one of its audit event.
    with django_assert_num_queries(5) as queries:
        response = as_member.post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 201, response.json()
    assert statements(queries) == ["SELECT", "SAVEPOINT", "INSERT", "INSERT", "RELEASE"]
    job_id = response.json()["job_id"]
    record = JobRecord.objects.get(job_id=job_id)
    assert (record.user, record.spec["hold"]) == ("max", True)
    assert AuditEvent.objects.filter(action="job.submitted", target=str(job_id)).count() == 1


def test_a_list_costs_what_one_job_does(
    live_controller: Any, as_member: APIClient, django_assert_num_queries: Any
) -> None:
    assert as_member.post("/api/v1/jobs", SPEC, format="json").status_code == 201  # warm
    with django_assert_num_queries(5):
        response = as_member.post("/api/v1/jobs", [SPEC] * 5, format="json")
    assert response.status_code == 201, response.json()
    ids = [job["job_id"] for job in response.json()["results"]]
    assert JobRecord.objects.filter(job_id__in=ids).count() == 5
    assert AuditEvent.objects.filter(action="job.submitted", target__in=map(str, ids)).count() == 5


def test_a_retried_submission_writes_its_audit_event_once(
    live_controller: Any, as_member: APIClient
) -> None:
    headers = {"HTTP_IDEMPOTENCY_KEY": "k-1"}
    first = as_member.post("/api/v1/jobs", SPEC, format="json", **headers)
    again = as_member.post("/api/v1/jobs", SPEC, format="json", **headers)
    assert first.status_code == again.status_code == 201
    job_id = first.json()["job_id"]
    assert again.json()["job_id"] == job_id
    assert JobRecord.objects.filter(job_id=job_id).count() == 1
    assert AuditEvent.objects.filter(action="job.submitted", target=str(job_id)).count() == 1


def test_a_record_the_first_event_wrote_keeps_it_and_gets_the_spec(
    live_controller: Any, as_member: APIClient, acme: Any
) -> None:
    from spurcloud.jobs.services import record_job_event
    from tests.spurcloud.conftest import event, job_dict

    response = as_member.post("/api/v1/jobs", SPEC, format="json")
    job_id = response.json()["job_id"] + 1  # the next job: its event comes before its answer
    record_job_event(
        event=event(job_dict(job_id, tenant="acme", user="max", state="RUNNING"), seq=10**6)
    )
    assert JobRecord.objects.get(job_id=job_id).spec is None
    second = as_member.post("/api/v1/jobs", SPEC, format="json")
    assert second.json()["job_id"] == job_id
    record = JobRecord.objects.get(job_id=job_id)
    assert (record.state, record.last_seq) == ("RUNNING", 10**6)  # the event's, kept
    assert record.spec is not None and record.spec["hold"] is True
