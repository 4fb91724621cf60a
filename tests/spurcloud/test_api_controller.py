"""The API operations that go through the controller, against a real `spurctld`
(tests/fixtures/controller.py) with one registered one-GPU node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from rest_framework.test import APIClient

from scheduler.core.contract import JobState
from scheduler.core.contract.runs import decode_column
from spurcloud.api.serializers import NodeSerializer
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.selectors import TENANT_GPU_KEYS, TENANT_NODE_KEYS
from spurcloud.jobs.tasks import job_events
from spurcloud.tenants.models import AuditEvent, Membership
from spurcloud.tenants.services import add_member, create_api_token
from tests.fixtures.processes import free_port, wait_until
from tests.spurcloud.conftest import Tenant, api_client, make_user

RUNNING = JobState.RUNNING.value
SCRIPT = "#!/bin/sh\nsleep 600\n"


@pytest.fixture
def as_billing(acme: Tenant) -> APIClient:
    """A billing member of acme: reads its jobs, submits none."""
    user = make_user("bill")
    add_member(
        organization=acme.organization, user=user, role=Membership.Role.BILLING, by=acme.owner
    )
    return api_client(user, acme.organization)


def _submit(client: APIClient, **spec: Any) -> Any:
    return client.post("/api/v1/jobs", {"script": SCRIPT, **spec}, format="json")


@pytest.mark.parametrize(("who", "username"), [("as_owner", "olivia"), ("as_member", "max")])
def test_members_submit_jobs_stamped_with_their_organisation_and_name(
    who: str, username: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    response = _submit(client, name="train", gpus_per_node=1)
    assert response.status_code == 201, response.json()
    job = response.json()
    assert (job["tenant"], job["user"], job["account"]) == ("acme", username, "acme")
    # As the controller has it when it answers: the leader may have started it already.
    assert job["state"] in ("PENDING", "RUNNING")
    assert job["spec"]["script"] == SCRIPT
    assert job["submit_time"].endswith("Z")
    # sacct sees it at once, before any event arrives
    record = JobRecord.objects.get(job_id=job["job_id"])
    assert (record.organization.slug, record.user, record.name) == ("acme", username, "train")
    assert AuditEvent.objects.filter(action="job.submitted", target=str(job["job_id"])).exists()


def test_an_outsiders_submission_belongs_to_the_outsiders_organisation(
    acme: Tenant, live_controller: Any, as_outsider: APIClient
) -> None:
    job = _submit(as_outsider).json()
    assert job["tenant"] == "globex"
    assert JobRecord.objects.get(job_id=job["job_id"]).organization.slug == "globex"


def test_a_malformed_job_is_400_with_the_reason(live_controller: Any, as_member: APIClient) -> None:
    response = as_member.post("/api/v1/jobs", {"name": "no script"}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"] == "missing job field: script"
    assert _submit(as_member, nodes=0).json()["detail"] == "nodes must be at least 1"


def test_a_job_the_cluster_cannot_run_is_400_with_the_controllers_message(
    live_controller: Any, as_member: APIClient
) -> None:
    response = _submit(as_member, gpus_per_node=8)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("Requested node configuration is not available")
    assert not JobRecord.objects.exists()


def test_a_job_cannot_claim_another_tenant(live_controller: Any, as_member: APIClient) -> None:
    response = _submit(as_member, tenant="globex")
    assert response.status_code == 400
    assert "token" in response.json()["detail"]


def test_a_retried_submission_with_the_same_idempotency_key_is_one_job(
    live_controller: Any, as_member: APIClient
) -> None:
    first = as_member.post(
        "/api/v1/jobs", {"script": SCRIPT}, format="json", HTTP_IDEMPOTENCY_KEY="abc"
    )
    again = as_member.post(
        "/api/v1/jobs", {"script": SCRIPT}, format="json", HTTP_IDEMPOTENCY_KEY="abc"
    )
    assert first.status_code == again.status_code == 201
    assert first.json()["job_id"] == again.json()["job_id"]
    assert JobRecord.objects.count() == 1


def test_a_member_cancels_their_own_job(live_controller: Any, as_member: APIClient) -> None:
    job_id = _submit(as_member).json()["job_id"]
    response = as_member.post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["state"] in ("CANCELLED", "COMPLETING")
    assert JobRecord.objects.get(job_id=job_id).state in ("CANCELLED", "COMPLETING")


def test_a_member_cannot_cancel_someone_elses_job(
    live_controller: Any, as_owner: APIClient, as_member: APIClient
) -> None:
    job_id = _submit(as_owner).json()["job_id"]
    response = as_member.post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    assert response.status_code == 403
    assert response.json()["detail"] == "You can cancel only your own jobs."


def test_an_owner_cancels_a_members_job(
    live_controller: Any, as_owner: APIClient, as_member: APIClient
) -> None:
    job_id = _submit(as_member).json()["job_id"]
    response = as_owner.post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    assert response.status_code == 200
    assert response.json()["cancelled_by"] == "olivia"


def test_an_outsider_cannot_cancel_the_job(
    live_controller: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    job_id = _submit(as_member).json()["job_id"]
    response = as_outsider.post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    assert response.status_code == 404
    assert response.json() == {"detail": f"Job {job_id} not found.", "code": "not_found"}


def test_a_signal_out_of_range_is_400(live_controller: Any, as_member: APIClient) -> None:
    job_id = _submit(as_member).json()["job_id"]
    response = as_member.post(f"/api/v1/jobs/{job_id}/cancel", {"signal": 99}, format="json")
    assert response.status_code == 400
    assert "signal" in response.json()["detail"]


@pytest.mark.parametrize("who", ["as_owner", "as_member"])
def test_members_read_the_live_queue_of_their_organisation(
    who: str, live_controller: Any, as_outsider: APIClient, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    running = _submit(client, gpus_per_node=1).json()["job_id"]
    waiting = _submit(client, gpus_per_node=1).json()["job_id"]
    _submit(as_outsider)
    # The pass that starts the first follows the submissions' commit (not within it).
    assert _running(client, running)["state"] == RUNNING
    body = client.get("/api/v1/queue").json()
    assert body["next"] is None
    jobs = {job["job_id"]: job for job in body["results"]}
    assert set(jobs) == {running, waiting}
    assert jobs[running]["state"] == RUNNING
    assert jobs[running]["start_time"].endswith("Z")
    assert jobs[waiting]["state"] == "PENDING"
    assert client.get("/api/v1/queue", {"state": "PENDING"}).json()["results"][0]["job_id"] == (
        waiting
    )


@pytest.mark.parametrize("who", ["as_owner", "as_member", "as_outsider"])
def test_the_queue_filters_as_squeue_does_within_the_organisation(
    who: str,
    live_controller: Any,
    as_owner: APIClient,
    as_member: APIClient,
    request: pytest.FixtureRequest,
) -> None:
    olivia = _submit(as_owner, name="a", gpus_per_node=1).json()["job_id"]
    max_waiting = _submit(as_member, name="b", gpus_per_node=1).json()["job_id"]
    client: APIClient = request.getfixturevalue(who)

    def ids(**query: str) -> list[int]:
        response = client.get("/api/v1/queue", query)
        assert response.status_code == 200, response.json()
        return [job["job_id"] for job in response.json()["results"]]

    mine = [olivia, max_waiting] if who != "as_outsider" else []
    assert ids(user="olivia,max") == mine
    assert ids(user="max", state="PENDING") == mine[1:]
    assert ids(name="a,zzz", partition="gpu") == mine[:1]
    assert ids(account="acme") == mine
    assert ids(id=f"{olivia},{max_waiting}", partition="cpu") == []
    assert ids(id=str(max_waiting)) == mine[1:]
    assert ids(user="max", name="a") == []
    refused = client.get("/api/v1/queue", {"user": "x" * 151})
    assert refused.status_code == 400
    assert "at most 150 characters" in refused.json()["detail"]


def test_the_queue_cut_to_fields_holds_those_and_the_job_id(
    live_controller: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    running = _submit(as_member, gpus_per_node=1).json()["job_id"]
    waiting = _submit(as_member, gpus_per_node=1).json()["job_id"]
    _submit(as_outsider)
    # The pass that starts the first follows the submissions' commit (not within it).
    assert _running(as_member, running)["state"] == RUNNING
    whole = as_member.get("/api/v1/queue").json()["results"]
    keys = ("job_id", "state", "start_time", "priority", "priority_factors")
    cut = as_member.get("/api/v1/queue", {"fields": ",".join(keys[1:])}).json()["results"]
    assert cut == [{k: job[k] for k in keys if k in job} for job in whole]
    assert [job["job_id"] for job in cut] == [running, waiting]
    assert cut[0]["start_time"].endswith("Z")  # times as the whole answer gives them
    # The filters still apply to fields not asked for.
    assert as_member.get("/api/v1/queue", {"fields": "name", "state": "PENDING"}).json()[
        "results"
    ] == [{"job_id": waiting, "name": whole[1]["name"]}]
    # The spec too, where asked (scontrol show job: one answer for every job).
    specs = as_member.get("/api/v1/queue", {"fields": "spec"}).json()["results"]
    single = as_member.get(f"/api/v1/queue/{waiting}").json()
    assert specs[1] == {"job_id": waiting, "spec": single["spec"]}
    for bad in ("script", "state,", "tenant,bogus"):
        refused = as_member.get("/api/v1/queue", {"fields": bad})
        assert refused.status_code == 400, bad


def _epoch(iso: str | None) -> int | None:
    from datetime import datetime

    return (
        None if iso is None else int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    )


@pytest.mark.parametrize("who", ["as_owner", "as_member", "as_billing", "as_outsider"])
def test_the_queue_as_columns_holds_what_its_rows_hold(
    who: str,
    live_controller: Any,
    as_member: APIClient,
    as_outsider: APIClient,
    request: pytest.FixtureRequest,
) -> None:
    """`shape=columns` (what squeue reads): a list per field asked for, in the rows'
    order, times as epoch seconds; the same jobs (the organisation's, filtered) as the
    rows answer, the controller's answer passed on as it came."""
    client: APIClient = request.getfixturevalue(who)
    running = _submit(as_member, name="r", gpus_per_node=1).json()["job_id"]
    waiting = _submit(as_member, name="w", gpus_per_node=1).json()["job_id"]
    other = _submit(as_outsider, name="o").json()["job_id"]
    # Read once the pass that starts the first (and the outsider's) has run: the answers
    # below are compared with each other, and a job that starts between two would differ.
    assert _running(as_member, running)["state"] == RUNNING
    assert _running(as_outsider, other)["state"] == RUNNING
    fields = "state,name,start_time,submit_time,nodes,priority"
    rows = client.get("/api/v1/queue", {"fields": fields}).json()["results"]
    answer = client.get("/api/v1/queue", {"fields": fields, "shape": "columns"})
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    body = answer.json()
    mine = [other] if who == "as_outsider" else [running, waiting]
    assert body["columns"]["job_id"] == [job["job_id"] for job in rows] == mine
    assert (body["n"], body["next"]) == (len(mine), None)
    assert set(body["columns"]) == {"job_id", *fields.split(",")}
    for name in ("state", "name", "nodes", "priority"):
        assert body["columns"][name] == [job[name] for job in rows]
    for name in ("start_time", "submit_time"):
        assert body["columns"][name] == [_epoch(job[name]) for job in rows]
    picked = client.get("/api/v1/queue", {"fields": "name", "shape": "columns", "state": "PENDING"})
    pending = [job["job_id"] for job in rows if job["state"] == "PENDING"]
    assert picked.json()["columns"]["job_id"] == pending and (who == "as_outsider" or pending)
    every = client.get("/api/v1/queue", {"shape": "columns"}).json()  # what each job has
    assert set(every["columns"]) == {k for job in rows_of(client) for k in job} - {
        "priority_factors"
    }
    assert client.get("/api/v1/queue", {"shape": "table", "fields": "name"}).status_code == 400
    # In runs (what squeue asks for): the same columns, read back.
    in_runs = client.get("/api/v1/queue", {"fields": fields, "shape": "runs"}).json()
    assert (in_runs["n"], in_runs["next"]) == (body["n"], None)
    assert {
        name: decode_column(column, in_runs["n"]) for name, column in in_runs["columns"].items()
    } == body["columns"]
    if who != "as_outsider":  # two jobs of one organisation, one user, one name each
        assert in_runs["columns"]["job_id"] == mine


def rows_of(client: APIClient) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = client.get("/api/v1/queue").json()["results"]
    return rows


def test_an_outsider_sees_none_of_the_organisations_queue(
    live_controller: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    _submit(as_member)
    assert as_outsider.get("/api/v1/queue").json() == {"results": [], "next": None}


@pytest.mark.parametrize("who", ["as_owner", "as_member", "as_outsider"])
def test_every_tenant_reads_nodes_and_partitions(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    nodes = client.get("/api/v1/nodes").json()
    assert [node["name"] for node in nodes["results"]] == ["node01"]
    assert nodes["next"] is None
    node = nodes["results"][0]
    # What sinfo needs, and nothing of how to reach the node or what others hold.
    assert set(node) == set(TENANT_NODE_KEYS)
    assert (node["cpus"], node["memory_mb"], node["partitions"]) == (16, 64000, ["gpu"])
    assert node["gpus"] == [{"index": 0, "vendor": "nvidia", "model": "h100", "memory_mb": 81920}]
    partitions = client.get("/api/v1/partitions").json()["results"]
    assert [(p["name"], p["default"], p["nodes"]) for p in partitions] == [
        ("gpu", True, ["node01"])
    ]


@pytest.mark.parametrize("who", ["as_owner", "as_member", "as_outsider"])
def test_tenants_do_not_see_agent_urls_pcie_addresses_or_others_gpus(
    who: str, live_controller: Any, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    _submit(request.getfixturevalue("as_member"), gpus_per_node=1)  # someone holds GPU 0
    # The leader places it in its next pass, right after the submission commits.
    wait_until(
        lambda: client.get("/api/v1/nodes").json()["results"][0]["gpus_alloc"] == 1,
        timeout=10,
        what="the job placed",
    )
    node = client.get("/api/v1/nodes").json()["results"][0]
    assert node["gpus_alloc"] == 1  # how much is taken, not which
    text = json.dumps(node)
    for secret in ("agent_url", "127.0.0.1:9", "gpus_in_use", "pci", "uuid", "numa", "labels"):
        assert secret not in text, secret


def _operator_client(tenant: Tenant, *, scopes: set[str]) -> APIClient:
    staff = make_user("operator", staff=True)
    add_member(organization=tenant.organization, user=staff)
    _, secret = create_api_token(
        user=staff, organization=tenant.organization, name="ops", scopes=scopes
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_an_operator_sees_every_node_detail(acme: Tenant, live_controller: Any) -> None:
    client = _operator_client(acme, scopes={"read", "admin"})
    node = client.get("/api/v1/nodes").json()["results"][0]
    assert node["agent_url"] == "http://127.0.0.1:9"
    assert node["gpus_in_use"] == []
    assert "pci" in node["gpus"][0]


def test_a_staff_users_everyday_token_sees_what_tenants_see(
    acme: Tenant, live_controller: Any
) -> None:
    client = _operator_client(acme, scopes={"read", "jobs"})
    node = client.get("/api/v1/nodes").json()["results"][0]
    assert set(node) == set(TENANT_NODE_KEYS)


def test_the_node_serializer_describes_what_tenants_get() -> None:
    assert set(NodeSerializer().fields) == set(TENANT_NODE_KEYS)
    assert set(NodeSerializer().fields["gpus"].child.fields) == set(TENANT_GPU_KEYS)


@pytest.mark.parametrize("who", ["as_owner", "as_member", "as_outsider"])
def test_a_member_may_not_raise_a_jobs_priority_with_a_negative_nice(
    who: str, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    response = _submit(client, nice=-100)
    assert response.status_code == 400
    body = response.json()
    assert body["detail"].startswith("nice: a negative nice raises the job's priority")
    assert list(body["errors"]) == ["nice"]
    assert not JobRecord.objects.exists()


def test_a_positive_nice_is_anyones(live_controller: Any, as_member: APIClient) -> None:
    response = _submit(as_member, nice=100)
    assert response.status_code == 201
    assert response.json()["spec"]["nice"] == 100


def test_an_operator_may_set_a_negative_nice(acme: Tenant, live_controller: Any) -> None:
    response = _submit(_operator_client(acme, scopes={"jobs", "admin"}), nice=-100)
    assert response.status_code == 201, response.json()
    assert response.json()["spec"]["nice"] == -100


def test_a_staff_users_everyday_token_may_not_set_a_negative_nice(acme: Tenant) -> None:
    response = _submit(_operator_client(acme, scopes={"read", "jobs"}), nice=-1)
    assert response.status_code == 400
    assert "nice" in response.json()["errors"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/nodes"),
        ("get", "/api/v1/partitions"),
        ("get", "/api/v1/queue"),
        ("post", "/api/v1/jobs"),
    ],  # fmt: skip
)
def test_an_unreachable_controller_is_503(
    method: str, path: str, settings: Any, as_member: APIClient
) -> None:
    settings.SPUR_CONTROLLER_URLS = [f"http://127.0.0.1:{free_port()}"]
    settings.SPUR_CONTROLLER_TIMEOUT_S = 2.0
    if method == "post":
        response = as_member.post(path, {"script": SCRIPT}, format="json")
    else:
        response = as_member.get(path)
    assert response.status_code == 503
    assert response.json()["detail"].startswith("The scheduler is unreachable")


def _drain_tasks(broker: Path) -> list[tuple[str, Any]]:
    """The tasks the controller sent to its (private) file broker, oldest first."""
    options = {
        "data_folder_in": str(broker),
        "data_folder_out": str(broker),
        "processed_folder": str(broker / "processed"),
        "control_folder": str(broker / "control"),
    }
    tasks = []
    with Connection("filesystem://", transport_options=options) as connection:
        queue = connection.SimpleQueue("celery")
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                break
            tasks.append((message.headers["task"], message.payload[0][0]))
            message.ack()
        queue.close()
    return tasks


def test_the_controllers_events_mirror_the_job_into_the_history(
    live_controller: Any, as_member: APIClient
) -> None:
    job_id = _submit(as_member, gpus_per_node=1).json()["job_id"]
    # Cancelled once running (launched): the pass that starts it follows the submission.
    assert _running(as_member, job_id)["state"] == RUNNING
    cancelled = as_member.post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json").json()
    # The leader sends tasks from its own thread after commit: wait until the broker
    # holds the events up to the cancel.
    tasks: list[tuple[str, Any]] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tasks += _drain_tasks(live_controller.config_path.parent / "broker")
        seqs = [e["seq"] for name, batch in tasks if name == "spur.job_events" for e in batch]
        if seqs and max(seqs) >= cancelled["seq"]:
            break
        time.sleep(0.05)
    batches = [payload for name, payload in tasks if name == "spur.job_events"]
    assert batches and {name for name, _ in tasks} >= {"spur.job_events", "spur.launch_jobs"}
    events = [e for batch in batches for e in batch]
    for payload in reversed(events):  # the worst order: newest first
        job_events([payload])
    for payload in events:  # and every one again
        assert job_events([payload]) == 0
    record = JobRecord.objects.get(job_id=job_id)
    assert record.last_seq == max(e["seq"] for e in events)
    assert record.nodes == ["node01"]
    assert record.state in ("CANCELLED", "COMPLETING")


def test_a_member_holds_and_releases_their_own_job(
    live_controller: Any, as_member: APIClient
) -> None:
    job_id = _submit(as_member, gpus_per_node=1, hold=True).json()["job_id"]
    held = as_member.get(f"/api/v1/queue?id={job_id}").json()["results"][0]
    assert (held["state"], held["reason"]) == ("PENDING", "JobHeldUser")
    released = as_member.post(f"/api/v1/jobs/{job_id}/release", format="json")
    assert released.status_code == 200
    assert released.json()["reason"] != "JobHeldUser"
    assert AuditEvent.objects.filter(action="job.controlled", target=str(job_id)).count() == 1


def test_a_member_cannot_hold_someone_elses_job_but_an_owner_can(
    live_controller: Any, as_member: APIClient, as_owner: APIClient
) -> None:
    job_id = _submit(as_owner, gpus_per_node=1, hold=True).json()["job_id"]
    refused = as_member.post(f"/api/v1/jobs/{job_id}/release", format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "You can release only your own jobs."
    assert as_owner.post(f"/api/v1/jobs/{job_id}/release", format="json").status_code == 200


def test_an_outsider_cannot_requeue_the_job_and_unknown_actions_do_not_exist(
    live_controller: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    job_id = _submit(as_member, gpus_per_node=1).json()["job_id"]
    missing = as_outsider.post(f"/api/v1/jobs/{job_id}/requeue", format="json")
    assert missing.status_code == 404
    assert missing.json() == {"detail": f"Job {job_id} not found.", "code": "not_found"}
    assert as_member.post(f"/api/v1/jobs/{job_id}/explode", format="json").status_code == 404


def test_a_misspelt_filter_is_refused_not_ignored(as_member: APIClient) -> None:
    response = as_member.get("/api/v1/jobs", {"stat": "RUNNING"})
    assert response.status_code == 400
    assert response.json()["detail"] == "unknown query parameter(s): stat"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": ""}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"id": "1,x"}, "id"),
        ({"id": str(2**70)}, "id"),
        ({"state": "running,BOGUS"}, "state"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"since": "yesterday"}, "since"),
    ],
)
def test_a_malformed_history_filter_is_a_400_naming_it(
    as_member: APIClient, query: dict[str, str], field: str
) -> None:
    response = as_member.get("/api/v1/jobs", query)
    assert response.status_code == 400
    assert field in response.json()["errors"]


@pytest.mark.parametrize("body", ["false", "[]", '{"signal": 9, "extra": 1}', '"x"'])
def test_an_action_body_that_is_not_its_object_is_refused(
    live_controller: Any, as_member: APIClient, body: str
) -> None:
    job_id = _submit(as_member).json()["job_id"]
    response = as_member.post(
        f"/api/v1/jobs/{job_id}/cancel", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert as_member.get(f"/api/v1/jobs/{job_id}").json()["state"] != "CANCELLED"


def test_a_hold_takes_no_signal_and_no_body(live_controller: Any, as_member: APIClient) -> None:
    job_id = _submit(as_member).json()["job_id"]
    response = as_member.post(f"/api/v1/jobs/{job_id}/hold", {"signal": 9}, format="json")
    assert response.status_code == 400
    assert "takes no body" in response.json()["detail"]


@pytest.mark.parametrize("who", ["as_owner", "as_member", "as_outsider"])
def test_an_output_file_in_etc_is_a_400_naming_the_field(
    who: str, acme: Tenant, request: pytest.FixtureRequest, settings: Any
) -> None:
    settings.SPUR_CONTROLLER_URLS = ["http://127.0.0.1:9"]  # never asked
    client: APIClient = request.getfixturevalue(who)
    response = _submit(client, stdout="/etc/x")
    assert response.status_code == 400
    body = response.json()
    assert "output file /etc/x is outside your organisation's workspace" in body["detail"]
    assert body.get("field", "stdout") == "stdout"


# -- scontrol suspend and resume: operators only --------------------------------------------


def _running(client: APIClient, job_id: int, state: str = RUNNING) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        job: dict[str, Any] = client.get(f"/api/v1/queue?id={job_id}").json()["results"][0]
        if job["state"] == state or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def test_an_operator_suspends_and_resumes_a_running_job(
    acme: Tenant, live_controller: Any, as_member: APIClient
) -> None:
    job_id = _submit(as_member, gpus_per_node=1).json()["job_id"]
    assert _running(as_member, job_id)["state"] == RUNNING
    operator = _operator_client(acme, scopes={"jobs", "admin"})
    suspended = operator.post(f"/api/v1/jobs/{job_id}/suspend", format="json")
    assert suspended.status_code == 200, suspended.json()
    body = suspended.json()
    assert body["state"] == "SUSPENDED" and body["suspended_at"] is not None
    assert body["nodes"] == ["node01"]  # it keeps what it holds
    again = operator.post(f"/api/v1/jobs/{job_id}/suspend", format="json")
    assert (again.status_code, again.json()["state"]) == (200, "SUSPENDED")
    resumed = operator.post(f"/api/v1/jobs/{job_id}/resume", format="json")
    assert resumed.status_code == 200
    assert (resumed.json()["state"], resumed.json()["suspended_at"]) == ("RUNNING", None)
    assert resumed.json()["suspended_s"] >= 0
    not_suspended = operator.post(f"/api/v1/jobs/{job_id}/resume", format="json")
    assert not_suspended.status_code == 409
    assert not_suspended.json()["detail"] == "Job is not suspended"
    actions = AuditEvent.objects.filter(action="job.controlled", target=str(job_id))
    assert [e.data["action"] for e in actions.order_by("id")] == ["suspend", "suspend", "resume"]


@pytest.mark.parametrize("who", ["as_owner", "as_member"])
def test_owners_and_members_may_not_suspend_or_resume(
    who: str, live_controller: Any, as_member: APIClient, request: pytest.FixtureRequest
) -> None:
    job_id = _submit(as_member, gpus_per_node=1).json()["job_id"]
    client: APIClient = request.getfixturevalue(who)
    for action in ("suspend", "resume"):
        refused = client.post(f"/api/v1/jobs/{job_id}/{action}", format="json")
        assert refused.status_code == 403
        assert refused.json()["detail"] == "Access/permission denied"
    assert _running(as_member, job_id)["state"] in ("PENDING", "RUNNING")


def test_a_staff_users_everyday_token_may_not_suspend(acme: Tenant, live_controller: Any) -> None:
    client = _operator_client(acme, scopes={"read", "jobs"})
    job_id = _submit(client, gpus_per_node=1).json()["job_id"]
    refused = client.post(f"/api/v1/jobs/{job_id}/suspend", format="json")
    assert refused.status_code == 403


def test_an_outsider_gets_the_same_404_for_a_suspend_as_for_a_missing_job(
    live_controller: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    job_id = _submit(as_member, gpus_per_node=1).json()["job_id"]
    for target in (job_id, 999999):
        missing = as_outsider.post(f"/api/v1/jobs/{target}/suspend", format="json")
        assert missing.status_code == 404
        assert missing.json() == {"detail": f"Job {target} not found.", "code": "not_found"}
