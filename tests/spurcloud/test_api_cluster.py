"""The admin commands' reads and scontrol update (spurcloud/api/cluster.py), against a
real `spurctld` (tests/fixtures/controller.py) with one registered one-GPU node: each as
owner, member and outsider, and as an operator where operators see more."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rest_framework.test import APIClient

from scheduler.core.contract import JobState
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import AuditEvent
from spurcloud.tenants.services import add_member, create_api_token
from tests.spurcloud.conftest import Tenant, make_user

SCRIPT = "#!/bin/sh\nsleep 600\n"
WHO = ["as_owner", "as_member", "as_outsider"]


def _submit(client: APIClient, **spec: Any) -> int:
    response = client.post("/api/v1/jobs", {"script": SCRIPT, **spec}, format="json")
    assert response.status_code == 201, response.json()
    return int(response.json()["job_id"])


def _operator(tenant: Tenant) -> APIClient:
    staff = make_user("operator", staff=True)
    add_member(organization=tenant.organization, user=staff)
    _, secret = create_api_token(
        user=staff, organization=tenant.organization, name="ops", scopes={"read", "jobs", "admin"}
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.mark.parametrize("who", WHO)
def test_a_live_job_with_its_spec_is_read_only_by_its_organisation(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    job_id = _submit(request.getfixturevalue("as_owner"), hold=True, name="held", nice=5)
    response = request.getfixturevalue(who).get(f"/api/v1/queue/{job_id}")
    if who == "as_outsider":
        assert response.status_code == 404
        assert "held" not in response.content.decode()
        return
    assert response.status_code == 200, response.json()
    job = response.json()
    assert (job["name"], job["state"], job["reason"]) == ("held", "PENDING", "JobHeldUser")
    assert job["spec"]["nice"] == 5


@pytest.mark.parametrize("who", WHO)
def test_ping_says_which_controllers_are_up_without_their_addresses(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    answer = request.getfixturevalue(who).get("/api/v1/ping").json()
    assert answer == {"controllers": [{"name": "spurctld0", "up": True, "role": "leader"}]}


def test_an_operator_sees_the_controllers_hosts(acme: Tenant, live_controller: Any) -> None:
    answer = _operator(acme).get("/api/v1/ping").json()
    assert answer["controllers"][0]["name"] == "127.0.0.1"


def test_ping_reports_an_unreachable_controller_as_down(
    live_controller: Any, as_member: APIClient, settings: Any
) -> None:
    settings.SPUR_CONTROLLER_URLS = [live_controller.url, "http://127.0.0.1:9"]
    rows = as_member.get("/api/v1/ping").json()["controllers"]
    assert [(r["name"], r["up"], r["role"]) for r in rows] == [
        ("spurctld0", True, "leader"), ("spurctld1", False, "unreachable")]  # fmt: skip


@pytest.mark.parametrize("who", WHO)
def test_the_configuration_and_topology_come_from_the_controller_and_the_contract(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    client = request.getfixturevalue(who)
    config = client.get("/api/v1/config").json()["config"]
    assert (config["MinJobAge"], config["MaxArraySize"]) == ("300 sec", "1001")
    # The test cluster has no switch tree configured.
    assert client.get("/api/v1/topology").json() == {"results": [], "next": None}
    assert config["PriorityType"] == "priority/multifactor"
    assert config["PriorityWeightFairShare"] == "10000"


def _pending_behind_a_running_job(client: APIClient) -> int:
    first = _submit(client, gpus_per_node=1)  # takes the one GPU
    # Placed before the second comes: submitted within one pass interval, both would be
    # ranked by one pass, the first still pending until its placement is committed.
    deadline = time.monotonic() + 10
    while True:
        (live,) = client.get("/api/v1/queue", {"id": first}).json()["results"]
        if live["state"] != JobState.PENDING.value:
            break
        assert time.monotonic() < deadline, live
        time.sleep(0.05)
    return _submit(client, gpus_per_node=1, name="waits")


def _priorities(client: APIClient, job_id: int) -> list[dict[str, Any]]:
    """The priorities answer, once the controller's pass has ranked `job_id`."""
    deadline = time.monotonic() + 10
    while True:
        rows = client.get("/api/v1/priorities").json()["results"]
        if any(r["job_id"] == job_id and r["priority"] for r in rows) or (
            time.monotonic() > deadline
        ):
            return list(rows)
        time.sleep(0.2)


@pytest.mark.parametrize("who", WHO)
def test_a_tenant_sees_the_priority_factors_of_its_own_pending_jobs_only(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    job_id = _pending_behind_a_running_job(request.getfixturevalue("as_member"))
    owner_rows = _priorities(request.getfixturevalue("as_owner"), job_id)
    rows = request.getfixturevalue(who).get("/api/v1/priorities").json()["results"]
    if who == "as_outsider":
        assert rows == []
        return
    assert rows == owner_rows
    (row,) = rows
    assert (row["job_id"], row["user"], row["account"]) == (job_id, "max", "acme")
    assert row["priority"] > 0
    assert 0.0 <= row["fairshare"] <= 1.0


def test_an_operator_sees_every_tenants_priorities(
    acme: Tenant, live_controller: Any, as_outsider: APIClient
) -> None:
    job_id = _pending_behind_a_running_job(as_outsider)
    rows = _priorities(_operator(acme), job_id)
    assert [(r["job_id"], r["account"]) for r in rows] == [(job_id, "globex")]


@pytest.mark.parametrize("who", WHO)
def test_each_tenant_sees_its_own_accounts_shares_and_members(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    rows = request.getfixturevalue(who).get("/api/v1/shares").json()["results"]
    expected = ("globex", ["", "gina", "oscar"]) if who == "as_outsider" else (
        "acme", ["", "max", "olivia"])  # fmt: skip
    assert {r["account"] for r in rows} == {expected[0]}
    assert [r["user"] for r in rows] == expected[1]
    assert all(r["raw_shares"] == 1 and r["fairshare"] == 1.0 for r in rows)


def test_an_operator_sees_every_accounts_shares(
    acme: Tenant, globex: Tenant, live_controller: Any
) -> None:
    rows = _operator(acme).get("/api/v1/shares").json()["results"]
    assert sorted({r["account"] for r in rows}) == ["acme", "globex"]


@pytest.mark.parametrize("who", WHO)
def test_associations_are_the_organisation_and_its_members(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    client = request.getfixturevalue(who)
    rows = client.get("/api/v1/associations").json()["results"]
    account = "globex" if who == "as_outsider" else "acme"
    assert {r["account"] for r in rows} == {account}
    assert rows[0]["user"] == "" and all(r["user"] for r in rows[1:])
    assert rows[0]["qos"] == ["normal", "spot", "interactive"]
    qos = client.get("/api/v1/qos").json()["results"]
    assert [q["name"] for q in qos] == ["normal", "spot", "interactive"]


# -- scontrol update ------------------------------------------------------------------------


@pytest.mark.parametrize("who", WHO)
def test_an_owner_updates_a_members_pending_job_and_an_outsider_cannot(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    job_id = _submit(request.getfixturevalue("as_member"), hold=True)
    body = {"name": "renamed", "time_limit_min": 90, "nice": 10, "comment": "later"}
    response = request.getfixturevalue(who).patch(f"/api/v1/queue/{job_id}", body, format="json")
    if who == "as_outsider":
        assert response.status_code == 404
        return
    assert response.status_code == 200, response.json()
    job = response.json()
    assert (job["name"], job["time_limit_min"], job["comment"]) == ("renamed", 90, "later")
    assert job["spec"]["nice"] == 10
    assert JobRecord.objects.get(job_id=job_id).name == "renamed"
    assert AuditEvent.objects.filter(target=str(job_id), data__action="update").exists()


def test_a_member_cannot_update_someone_elses_job(
    live_controller: Any, as_owner: APIClient, as_member: APIClient
) -> None:
    job_id = _submit(as_owner, hold=True)
    response = as_member.patch(f"/api/v1/queue/{job_id}", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert response.json()["detail"] == "You can update only your own jobs."


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"gpus_per_node": 4}, 400, "non_field_errors"),
        ({"time_limit_min": -3}, 400, "time_limit_min"),
        ({"nice": -1}, 400, "nice"),
        ({"partition": "nowhere"}, 400, ""),
    ],
)
def test_a_bad_update_is_refused_and_changes_nothing(
    body: dict[str, Any], status: int, field: str, live_controller: Any, as_member: APIClient
) -> None:
    job_id = _submit(as_member, hold=True, name="kept")
    response = as_member.patch(f"/api/v1/queue/{job_id}", body, format="json")
    assert response.status_code == status, response.json()
    if field:
        assert field in response.json()["errors"], response.json()
    assert as_member.get(f"/api/v1/queue/{job_id}").json()["name"] == "kept"


def test_an_empty_update_changes_nothing(live_controller: Any, as_member: APIClient) -> None:
    job_id = _submit(as_member, hold=True, name="kept")
    response = as_member.patch(f"/api/v1/queue/{job_id}", {}, format="json")
    assert (response.status_code, response.json()["name"]) == (200, "kept")
    assert not AuditEvent.objects.filter(target=str(job_id), data__action="update").exists()


def test_a_running_job_is_not_updated(live_controller: Any, as_member: APIClient) -> None:
    job_id = _submit(as_member, gpus_per_node=1)
    deadline = time.monotonic() + 10
    while as_member.get(f"/api/v1/queue/{job_id}").json()["state"] == "PENDING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    response = as_member.patch(f"/api/v1/queue/{job_id}", {"name": "x"}, format="json")
    assert response.status_code == 409
    assert response.json()["detail"] == "Job is no longer pending execution"


def test_an_operator_may_set_a_negative_nice(acme: Tenant, live_controller: Any) -> None:
    client = _operator(acme)
    job_id = _submit(client, hold=True)
    response = client.patch(f"/api/v1/queue/{job_id}", {"nice": -100}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["spec"]["nice"] == -100
