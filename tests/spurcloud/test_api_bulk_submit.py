"""Bulk submission: POST /api/v1/jobs with a list of specs, against a real `spurctld`
with one registered one-GPU node. Checked first, committed together, answered in order."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import AuditEvent
from tests.spurcloud.conftest import Tenant

SCRIPT = "#!/bin/sh\nsleep 600\n"


def spec(**fields: Any) -> dict[str, Any]:
    return {"script": SCRIPT, "hold": True, **fields}


@pytest.mark.parametrize(("who", "username"), [("as_owner", "olivia"), ("as_member", "max")])
def test_members_submit_several_jobs_at_once_each_stamped_and_recorded(
    who: str, username: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    response = client.post("/api/v1/jobs", [spec(name=f"b{i}") for i in range(3)], format="json")
    assert response.status_code == 201, response.json()
    jobs = response.json()["results"]
    assert [job["name"] for job in jobs] == ["b0", "b1", "b2"]
    ids = [job["job_id"] for job in jobs]
    assert ids == list(range(ids[0], ids[0] + 3))  # in order, one after another
    assert {(job["tenant"], job["user"]) for job in jobs} == {("acme", username)}
    records = JobRecord.objects.filter(job_id__in=ids)
    assert {(r.organization.slug, r.user) for r in records} == {("acme", username)}
    assert AuditEvent.objects.filter(action="job.submitted", target__in=map(str, ids)).count() == 3


def test_an_outsiders_list_lands_in_the_outsiders_organisation(
    acme: Tenant, live_controller: Any, as_outsider: APIClient
) -> None:
    jobs = as_outsider.post("/api/v1/jobs", [spec(), spec()], format="json").json()["results"]
    assert {job["tenant"] for job in jobs} == {"globex"}
    refused = as_outsider.post("/api/v1/jobs", [spec(), spec(tenant="acme")], format="json")
    assert refused.status_code == 400
    assert "job 1" in refused.json()["detail"]


def test_one_invalid_spec_refuses_the_list_and_submits_nothing(
    live_controller: Any, as_member: APIClient
) -> None:
    before = JobRecord.objects.count()
    response = as_member.post(
        "/api/v1/jobs", [spec(), spec(time_limit_min=-5), spec()], format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["detail"].startswith("1.time_limit_min"), body
    assert "1" in body["errors"]
    assert JobRecord.objects.count() == before
    assert as_member.get("/api/v1/queue").json()["results"] == []


def test_a_job_the_scheduler_refuses_fails_alone(
    live_controller: Any, as_member: APIClient
) -> None:
    response = as_member.post(
        "/api/v1/jobs", [spec(name="ok"), spec(gpus_per_node=64), spec(name="ok2")], format="json"
    )
    assert response.status_code == 201, response.json()
    first, refused, last = response.json()["results"]
    assert (first["name"], last["name"]) == ("ok", "ok2")
    assert "Requested node configuration is not available" in refused["detail"]
    assert refused["code"]
    assert last["job_id"] == first["job_id"] + 1  # the refused one took no id
    queue = [job["job_id"] for job in as_member.get("/api/v1/queue").json()["results"]]
    assert queue == [first["job_id"], last["job_id"]]


@pytest.mark.parametrize("body", [[], [spec()] * 101, [spec(), "not a spec"], [[spec()]]])
def test_a_list_out_of_bounds_or_of_other_things_is_400(
    body: Any, live_controller: Any, as_member: APIClient
) -> None:
    response = as_member.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["detail"]
    assert as_member.get("/api/v1/queue").json()["results"] == []


def test_a_retried_list_with_its_idempotency_key_lands_on_the_same_jobs(
    live_controller: Any, as_member: APIClient
) -> None:
    body = [spec(name="x"), spec(name="y")]
    headers = {"HTTP_IDEMPOTENCY_KEY": "bulk-1"}
    first = as_member.post("/api/v1/jobs", body, format="json", **headers).json()["results"]
    again = as_member.post("/api/v1/jobs", body, format="json", **headers).json()["results"]
    assert [j["job_id"] for j in again] == [j["job_id"] for j in first]
    assert len(as_member.get("/api/v1/queue").json()["results"]) == 2


def test_each_job_of_a_list_counts_against_the_submissions_a_minute(
    live_controller: Any, as_member: APIClient, settings: Any
) -> None:
    settings.API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION = 3
    assert as_member.post("/api/v1/jobs", [spec(), spec()], format="json").status_code == 201
    over = as_member.post("/api/v1/jobs", [spec(), spec()], format="json")
    assert over.status_code == 429
    assert "3 job submissions" in over.json()["detail"]
    assert len(as_member.get("/api/v1/queue").json()["results"]) == 2
