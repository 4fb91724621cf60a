"""The job history API (GET /api/v1/jobs, GET /api/v1/jobs/{id}): read from the database,
scoped to the token's organisation."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from scheduler.core.contract.runs import decode_column
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import record_job_event
from spurcloud.tenants.models import Membership
from spurcloud.tenants.services import add_member
from tests.spurcloud.conftest import Tenant, api_client, event, job_dict, make_user


@pytest.fixture
def as_billing(acme: Tenant) -> APIClient:
    """A billing member of acme: reads its jobs, submits none."""
    user = make_user("bill")
    add_member(
        organization=acme.organization, user=user, role=Membership.Role.BILLING, by=acme.owner
    )
    return api_client(user, acme.organization)


@pytest.fixture
def acme_jobs(acme: Tenant) -> list[int]:
    ids = []
    for job_id, user, state in [
        (1, "max", "COMPLETED"),
        (2, "olivia", "RUNNING"),
        (3, "max", "FAILED"),
        (4, "max", "PENDING"),
    ]:
        ended = 1_700_000_100.0 if state in ("COMPLETED", "FAILED") else None
        job = job_dict(job_id, tenant="acme", user=user, state=state, end_time=ended)
        record_job_event(event=event(job))
        ids.append(job_id)
    return ids


@pytest.fixture
def globex_job(globex: Tenant) -> int:
    record_job_event(event=event(job_dict(99, tenant="globex", user="oscar", state="RUNNING")))
    return 99


@pytest.mark.parametrize("who", ["as_owner", "as_member"])
def test_members_list_their_organisations_jobs(
    who: str, acme_jobs: list[int], globex_job: int, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    response = client.get("/api/v1/jobs")
    assert response.status_code == 200
    body = response.json()
    assert [job["job_id"] for job in body["results"]] == [1, 2, 3, 4]
    assert body["next"] is None
    assert {job["tenant"] for job in body["results"]} == {"acme"}


def test_an_outsider_sees_none_of_the_organisations_jobs(
    acme_jobs: list[int], globex_job: int, as_outsider: APIClient
) -> None:
    response = as_outsider.get("/api/v1/jobs")
    assert [job["job_id"] for job in response.json()["results"]] == [99]


def test_a_job_object_has_the_job_dict_keys_with_iso_times(
    acme_jobs: list[int], as_member: APIClient
) -> None:
    job = as_member.get("/api/v1/jobs", {"id": "1"}).json()["results"][0]
    for key in ("job_id", "name", "tenant", "user", "account", "partition", "qos", "state",
                "reason", "time_limit_min", "nodes", "num_nodes", "num_cpus", "num_gpus",
                "allocation", "exit_code", "signal", "attempt", "workdir", "stdout", "stderr",
                "seq"):  # fmt: skip
        assert key in job, key
    assert job["end_time"] == "2023-11-14T22:15:00Z"
    assert job["submit_time"].endswith("Z")
    assert job["start_time"] is None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"id": "1,3"}, [1, 3]),
        ({"state": "COMPLETED,FAILED"}, [1, 3]),
        ({"user": "olivia"}, [2]),
        ({"name": "train-4"}, [4]),
        ({"since": "2023-11-14T22:16:00Z"}, [2, 4]),  # 1 and 3 ended before
        ({"until": "2000-01-01T00:00:00Z"}, []),
        ({"user": "olivia,max"}, [1, 2, 3, 4]),  # any of several, as sacct -u a,b
        ({"user": "olivia,nobody"}, [2]),
        ({"account": "acme,other"}, [1, 2, 3, 4]),
        ({"account": "other"}, []),
        ({"partition": "gpu", "user": "max", "state": "FAILED,PENDING"}, [3, 4]),
        ({"partition": "cpu"}, []),
    ],
)
def test_the_history_filters_as_sacct_does(
    query: dict[str, str], expected: list[int], acme_jobs: list[int], as_member: APIClient
) -> None:
    response = as_member.get("/api/v1/jobs", query)
    assert response.status_code == 200, response.json()
    assert [job["job_id"] for job in response.json()["results"]] == expected


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"state": "DANCING"}, "comma-separated list of states"),
        ({"id": "a,b"}, "job ids"),
        ({"since": "x"}, ""),
        ({"user": ",".join(f"u{i}" for i in range(101))}, "at most 100 comma-separated"),
        ({"partition": "p" * 65}, "at most 64 characters"),
        ({"account": "a\x00b"}, "account: must be at most 100 comma-separated names"),
        ({"user": "a,,b"}, "user: must be at most"),
        ({"limit": "50001", "fields": "name"}, "limit"),
    ],
)
def test_a_malformed_filter_is_400_with_a_detail(
    query: dict[str, str], message: str, acme: Tenant, as_member: APIClient
) -> None:
    response = as_member.get("/api/v1/jobs", query)
    assert response.status_code == 400
    assert message in response.json()["detail"]


def test_the_history_pages_with_a_next_link(acme_jobs: list[int], as_member: APIClient) -> None:
    first = as_member.get("/api/v1/jobs", {"limit": 3}).json()
    assert [job["job_id"] for job in first["results"]] == [1, 2, 3]
    assert first["next"]
    second = as_member.get(first["next"]).json()
    assert [job["job_id"] for job in second["results"]] == [4]
    assert second["next"] is None


def test_listing_jobs_costs_the_same_queries_for_many_jobs(
    acme: Tenant, as_member: APIClient, django_assert_max_num_queries: Any
) -> None:
    for job_id in range(1, 61):
        record_job_event(event=event(job_dict(job_id, tenant="acme", user="max")))
    as_member.get("/api/v1/jobs")  # the token's first use writes last_used_at once
    # token (with user, organisation, membership) + one page of jobs
    with django_assert_max_num_queries(2):
        response = as_member.get("/api/v1/jobs")
    assert len(response.json()["results"]) == 60


@pytest.mark.parametrize("who", ["as_owner", "as_member"])
def test_members_read_one_job_with_its_spec(
    who: str, acme_jobs: list[int], request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    response = client.get("/api/v1/jobs/2")
    assert response.status_code == 200
    assert response.json()["job_id"] == 2
    assert "spec" in response.json()


def test_another_organisations_job_is_404_exactly_like_a_missing_one(
    acme_jobs: list[int], globex: Tenant, as_outsider: APIClient
) -> None:
    foreign = as_outsider.get("/api/v1/jobs/2")
    missing = as_outsider.get("/api/v1/jobs/2000")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["detail"] == "Job 2 not found."
    assert missing.json()["detail"] == "Job 2000 not found."
    assert foreign.headers.get("Content-Type") == missing.headers.get("Content-Type")


def test_cancelling_another_organisations_job_is_the_same_404(
    acme_jobs: list[int], as_outsider: APIClient
) -> None:
    response = as_outsider.post("/api/v1/jobs/2/cancel", {}, format="json")
    assert response.status_code == 404
    assert response.json()["detail"] == "Job 2 not found."


def test_the_schema_is_an_openapi_3_document_and_the_docs_render(db: None) -> None:
    client = APIClient()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    document = schema.json()
    assert document["openapi"].startswith("3.")
    for path in ("/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/cancel",
                 "/api/v1/queue", "/api/v1/nodes", "/api/v1/partitions"):  # fmt: skip
        assert path in document["paths"], path
    assert document["components"]["securitySchemes"]["apiToken"]["scheme"] == "bearer"
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content


@pytest.mark.parametrize(
    ("who", "expected", "by_id"),
    [
        ("as_owner", [1, 3, 4], [1, 3, 4]),
        ("as_member", [1, 3, 4], [1, 3, 4]),
        ("as_outsider", [99], []),  # its own oscar's job; none of acme's
    ],
)
def test_list_filters_never_reach_another_organisations_jobs(
    who: str,
    expected: list[int],
    by_id: list[int],
    acme_jobs: list[int],
    globex_job: int,
    request: pytest.FixtureRequest,
) -> None:
    """Filters naming another organisation's users, account or jobs find nothing of it."""
    client: APIClient = request.getfixturevalue(who)
    query = {"user": "max,oscar", "account": "acme,globex", "partition": "gpu", "limit": "1000"}
    response = client.get("/api/v1/jobs", query)
    assert response.status_code == 200, response.json()
    assert [job["job_id"] for job in response.json()["results"]] == expected
    named = client.get("/api/v1/jobs", {"id": "1,3,4,99", "user": "max"}).json()["results"]
    assert [job["job_id"] for job in named] == by_id


def test_a_list_shows_the_spec_keys_as_the_job_itself_does(
    acme_jobs: list[int], as_member: APIClient, django_assert_max_num_queries: Any
) -> None:
    """The list reads only the spec keys it shows (not each job's whole spec and script),
    and shows the same as the job's own answer."""
    JobRecord.objects.filter(job_id=1).update(
        spec={"script": "#!/bin/sh\ntrue\n", "comment": "c1", "gpu_type": "mi300x"}
    )
    as_member.get("/api/v1/jobs")  # the token's first use writes last_used_at once
    with django_assert_max_num_queries(2):
        listed = as_member.get("/api/v1/jobs", {"id": "1,2"}).json()["results"]
    one = as_member.get("/api/v1/jobs/1").json()
    assert (listed[0]["comment"], listed[0]["gpu_type"]) == ("c1", "mi300x")
    assert {k: v for k, v in one.items() if k != "spec"} == listed[0]
    assert (listed[1]["comment"], listed[1]["gpu_type"]) == ("", "")


def test_a_list_cut_to_fields_holds_those_and_the_job_id(
    acme_jobs: list[int], as_member: APIClient
) -> None:
    """`fields` (what sacct prints) cuts each job of the list; the values are those of
    the whole job object."""
    JobRecord.objects.filter(job_id=1).update(spec={"script": "x", "comment": "c1"})
    whole = as_member.get("/api/v1/jobs").json()["results"]
    cut = as_member.get("/api/v1/jobs", {"fields": "state,end_time,comment,seq"}).json()
    keys = ("job_id", "state", "end_time", "comment", "seq")
    assert cut["results"] == [{k: job[k] for k in keys} for job in whole]
    assert cut["results"][0]["comment"] == "c1"
    paged = as_member.get("/api/v1/jobs", {"fields": "name", "limit": 3}).json()
    assert paged["results"][0] == {"job_id": 1, "name": whole[0]["name"]}
    assert as_member.get(paged["next"]).json()["results"] == [{"job_id": 4, "name": "train-4"}]
    # A cut page may be far larger than a page of whole jobs (sacct's one request).
    big = as_member.get("/api/v1/jobs", {"fields": "name", "limit": 10_000})
    assert big.status_code == 200 and len(big.json()["results"]) == len(whole)


def test_a_page_of_whole_jobs_holds_at_most_the_smaller_bound(
    acme_jobs: list[int], as_member: APIClient, settings: Any
) -> None:
    settings.API_MAX_PAGE_SIZE = 2
    whole = as_member.get("/api/v1/jobs", {"limit": 10_000}).json()
    assert [job["job_id"] for job in whole["results"]] == [1, 2] and whole["next"]
    cut = as_member.get("/api/v1/jobs", {"limit": 10_000, "fields": "name"}).json()
    assert len(cut["results"]) == 4 and cut["next"] is None


@pytest.mark.parametrize("fields", ["state,script", "priority", "spec", "", "state,,name"])
def test_a_field_the_history_does_not_hold_is_400(
    fields: str, acme: Tenant, as_member: APIClient
) -> None:
    response = as_member.get("/api/v1/jobs", {"fields": fields})
    assert response.status_code == 400
    assert response.json()["detail"]


@pytest.mark.parametrize(
    ("who", "expected"),
    [("as_owner", [1, 2, 3, 4]), ("as_member", [1, 2, 3, 4]), ("as_billing", [1, 2, 3, 4]),
     ("as_outsider", [99])],
)  # fmt: skip
def test_the_history_as_columns_holds_what_its_rows_hold(
    who: str,
    expected: list[int],
    acme_jobs: list[int],
    globex_job: int,
    request: pytest.FixtureRequest,
    django_assert_max_num_queries: Any,
) -> None:
    """`shape=columns` (what sacct reads): a list per field asked for, in the rows' order,
    times as epoch seconds (computed by the database), JSON values as they are; the
    same jobs and pages as the rows answer."""
    from datetime import datetime

    client: APIClient = request.getfixturevalue(who)
    JobRecord.objects.filter(job_id=1).update(spec={"script": "x", "comment": "c1"})
    fields = "state,end_time,submit_time,nodes,allocation,steps,comment,tenant,interactive"
    rows = client.get("/api/v1/jobs", {"fields": fields}).json()["results"]
    with django_assert_max_num_queries(2):
        body = client.get("/api/v1/jobs", {"fields": fields, "shape": "columns"}).json()
    assert (body["n"], body["next"], body["columns"]["job_id"]) == (len(expected), None, expected)
    for name in ("state", "nodes", "allocation", "steps", "comment", "tenant", "interactive"):
        assert body["columns"][name] == [job[name] for job in rows], name
    for name in ("end_time", "submit_time"):
        assert body["columns"][name] == [
            None if job[name] is None
            else int(datetime.fromisoformat(job[name].replace("Z", "+00:00")).timestamp())
            for job in rows
        ]  # fmt: skip
    paged = client.get("/api/v1/jobs", {"fields": "name", "shape": "columns", "limit": 3}).json()
    assert paged["columns"]["job_id"] == expected[:3]
    if len(expected) > 3:
        rest = client.get(paged["next"]).json()
        assert (rest["n"], rest["columns"]["job_id"], rest["next"]) == (1, expected[3:], None)
    every = client.get("/api/v1/jobs", {"shape": "columns"}).json()  # the rows' fields
    assert set(every["columns"]) == set(client.get("/api/v1/jobs").json()["results"][0])
    # In runs (what sacct asks for): the same columns, read back, and as many queries.
    with django_assert_max_num_queries(2):
        in_runs = client.get("/api/v1/jobs", {"fields": fields, "shape": "runs"}).json()
    assert (in_runs["n"], in_runs["next"]) == (body["n"], None)
    assert {
        name: decode_column(column, in_runs["n"]) for name, column in in_runs["columns"].items()
    } == body["columns"]
    assert in_runs["columns"]["tenant"] == ({"runs": [[rows[0]["tenant"], len(rows)]]}
                                           if len(rows) > 1 else [rows[0]["tenant"]])  # fmt: skip
