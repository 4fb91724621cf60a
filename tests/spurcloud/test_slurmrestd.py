"""The slurmrestd routes over real HTTP (pytest-django's live server, a plain httpx
client) against a real controller (`live_controller`: one node, one GPU), as owner,
member and outsider; every answer validated against Slurm's OpenAPI document of its
version (test_slurmrestd_schema.validate). Bad input and bad credentials are answered
with an error body in slurmrestd's shape, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings

from scheduler.core.contract import JobState
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.services import create_api_token
from tests.fixtures.processes import wait_until
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.test_slurmrestd_schema import needs_reference, validate

pytestmark = [needs_reference, pytest.mark.django_db(transaction=True)]

VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")
SCRIPT = "#!/bin/sh\nsleep 600\n"


class Rest:
    """A slurmrestd client as Slurm's tools use it: the token in X-SLURM-USER-TOKEN."""

    def __init__(self, base: str, secret: str, user: str) -> None:
        self.http = httpx.Client(
            base_url=f"{base}/slurm",
            headers={"X-SLURM-USER-TOKEN": secret, "X-SLURM-USER-NAME": user},
            timeout=30,
        )

    def call(
        self, method: str, path: str, schema: str, *, status: int = 200, **kwargs: Any
    ) -> dict[str, Any]:
        """The answer's body, checked: its status, Slurm's schema for the route, and (for
        an error) the error list."""
        response = self.http.request(method, path, **kwargs)
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/json")
        body: dict[str, Any] = response.json()
        version = path.strip("/").split("/")[0]
        validate(version, schema, body)
        assert bool(body["errors"]) == (status >= 400), body
        return body

    def submit(self, version: str = "v0.0.41", **job: Any) -> dict[str, Any]:
        return self.call(
            "POST",
            f"/{version}/job/submit",
            "openapi_job_submit_response",
            json={"job": {"script": SCRIPT, **job}},
        )


def _workdir() -> str:
    return str(django_settings.SPUR_WORK_ROOT)


@pytest.fixture
def rest(live_server: Any, live_controller: Any, acme: Tenant, globex: Tenant) -> Iterator[Any]:
    clients: list[Rest] = []

    def make(user: Any, organization: Any, scopes: Any = None) -> Rest:
        kwargs = {"scopes": scopes} if scopes is not None else {}
        _, secret = create_api_token(user=user, organization=organization, name="t", **kwargs)
        client = Rest(live_server.url, secret, user.get_username())
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.http.close()


def _job(rest: Rest, version: str, job_id: int, status: int = 200) -> dict[str, Any]:
    return rest.call("GET", f"/{version}/job/{job_id}", "openapi_job_info_resp", status=status)


@pytest.mark.parametrize("who", ["owner", "member"])
def test_members_submit_read_and_cancel_through_every_version(
    who: str, rest: Any, acme: Tenant
) -> None:
    user = acme.owner if who == "owner" else acme.member
    client = rest(user, acme.organization)
    workdir = f"{_workdir()}/acme"
    for version in VERSIONS:
        answer = client.submit(
            version,
            name=f"rest-{version}",
            current_working_directory=workdir,
            environment=["PATH=/bin:/usr/bin"],
            tres_per_node="gres/gpu:1",
            time_limit={"set": True, "infinite": False, "number": 30},
            mail_type=["END"],
        )
        job_id = answer["job_id"]
        assert answer["step_id"] == "batch" and answer["result"]["job_id"] == job_id
        assert [w["source"] for w in answer["warnings"]] == ["#/job/mail_type"]
        assert answer["meta"]["client"] == {"source": "", "user": user.username, "group": "acme"}
        # It really is a job: in the controller, and in the history sacct reads.
        record = JobRecord.objects.get(job_id=job_id)
        assert (record.organization.slug, record.user, record.name) == (
            "acme",
            user.username,
            f"rest-{version}",
        )
        (info,) = _job(client, version, job_id)["jobs"]
        assert info["job_id"] == job_id
        assert info["job_state"][0] in ("PENDING", "RUNNING")
        assert (info["user_name"], info["account"], info["group_name"]) == (
            user.username,
            "acme",
            "acme",
        )
        assert info["tres_per_node"] == "gres/gpu:1"
        assert info["time_limit"]["number"] == 30
        assert info["current_working_directory"] == workdir
        listed = client.call("GET", f"/{version}/jobs", "openapi_job_info_resp")["jobs"]
        assert job_id in [j["job_id"] for j in listed]

        schema = "openapi_kill_job_resp" if version == "v0.0.42" else "openapi_resp"
        client.call("DELETE", f"/{version}/job/{job_id}", schema)
        (info,) = _job(client, version, job_id)["jobs"]
        assert info["job_state"][0] in ("CANCELLED", "COMPLETING")
        # Cancelling it again changes nothing (as `scancel` of an ended job is silent).
        client.call("DELETE", f"/{version}/job/{job_id}", schema)
        assert _job(client, version, job_id)["jobs"][0]["job_state"] == info["job_state"]


def test_an_outsider_sees_only_its_own_jobs_and_gets_404_for_the_others(
    rest: Any, acme: Tenant, globex: Tenant
) -> None:
    member = rest(acme.member, acme.organization)
    outsider = rest(globex.owner, globex.organization)
    theirs = member.submit(current_working_directory=f"{_workdir()}/acme")["job_id"]
    mine = outsider.submit(current_working_directory=f"{_workdir()}/globex")["job_id"]
    for version in VERSIONS:
        listed = outsider.call("GET", f"/{version}/jobs", "openapi_job_info_resp")["jobs"]
        assert [j["job_id"] for j in listed] == [mine]
        missing = _job(outsider, version, theirs, status=404)
        assert missing["errors"][0]["error"] == "Invalid job id specified"
        assert missing["errors"][0]["error_number"] == 2017
        schema = "openapi_kill_job_resp" if version == "v0.0.42" else "openapi_resp"
        outsider.call("DELETE", f"/{version}/job/{theirs}", schema, status=404)
        outsider.call("DELETE", f"/{version}/job/{theirs}?signal=KILL", schema, status=404)
        # The same answer as for a job that does not exist at all.
        assert _job(outsider, version, 999_999, status=404)["errors"][0]["error_number"] == 2017
    assert _job(member, "v0.0.42", theirs)["jobs"][0]["job_state"][0] in ("PENDING", "RUNNING")


def test_a_member_cannot_cancel_the_owners_job_but_the_owner_cancels_the_members(
    rest: Any, acme: Tenant
) -> None:
    owner, member = rest(acme.owner, acme.organization), rest(acme.member, acme.organization)
    workdir = f"{_workdir()}/acme"
    owners = owner.submit(current_working_directory=workdir)["job_id"]
    members = member.submit(current_working_directory=workdir)["job_id"]
    refused = member.call("DELETE", f"/v0.0.41/job/{owners}", "openapi_resp", status=403)
    assert refused["errors"][0]["description"] == "You can cancel only your own jobs."
    # A member sees the organisation's queue, as squeue shows it.
    listed = member.call("GET", "/v0.0.41/jobs", "openapi_job_info_resp")["jobs"]
    assert {j["job_id"] for j in listed} == {owners, members}
    owner.call("DELETE", f"/v0.0.41/job/{members}", "openapi_resp")
    assert _job(owner, "v0.0.41", members)["jobs"][0]["job_state"][0] in (
        "CANCELLED",
        "COMPLETING",
    )


def test_a_signal_is_sent_not_a_cancel_and_a_bad_one_is_refused(rest: Any, acme: Tenant) -> None:
    client = rest(acme.member, acme.organization)
    job_id = client.submit(current_working_directory=f"{_workdir()}/acme")["job_id"]
    # Signalled once running: the pass that starts it follows the submission's commit.
    wait_until(
        lambda: (
            _job(client, "v0.0.42", job_id)["jobs"][0]["job_state"][0] == JobState.RUNNING.value
        ),
        what="the job started",
    )
    bad = client.call(
        "DELETE", f"/v0.0.42/job/{job_id}?signal=SIGNOPE", "openapi_kill_job_resp", status=400
    )
    assert "Invalid job signal" in bad["errors"][0]["description"]
    client.call("DELETE", f"/v0.0.42/job/{job_id}?signal=99", "openapi_kill_job_resp", status=400)
    client.call("DELETE", f"/v0.0.42/job/{job_id}?signal=USR1", "openapi_kill_job_resp")
    assert _job(client, "v0.0.42", job_id)["jobs"][0]["job_state"][0] == "RUNNING"


def test_submissions_the_services_refuse_are_slurm_errors_and_submit_nothing(
    rest: Any, acme: Tenant
) -> None:
    client = rest(acme.member, acme.organization)

    def refused(status: int = 400, **job: Any) -> dict[str, Any]:
        body = client.call(
            "POST",
            "/v0.0.42/job/submit",
            "openapi_job_submit_response",
            status=status,
            json={"job": {"script": SCRIPT, **job}},
        )
        return dict(body["errors"][0])

    # Outside the organisation's workspace (another organisation's, here).
    error = refused(current_working_directory=f"{_workdir()}/globex")
    assert error["source"] == "#/job/current_working_directory"
    # More GPUs than the cluster has: the controller's words.
    error = refused(tres_per_node="gres/gpu:8")
    assert error["description"].startswith("Requested node configuration is not available")
    assert error["error_number"] == 2014
    # A negative nice is for operators.
    assert refused(nice=-5)["source"] == "#/job/nice"
    assert refused(time_limit=10**15)["source"] == "#/job/time_limit"
    assert not JobRecord.objects.exists()


def test_the_organisations_submission_limit_applies(rest: Any, acme: Tenant, settings: Any) -> None:
    settings.API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION = 1
    client = rest(acme.member, acme.organization)
    client.submit(current_working_directory=f"{_workdir()}/acme")
    response = client.http.post("/v0.0.41/job/submit", json={"job": {"script": SCRIPT}})
    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) >= 0
    validate("v0.0.41", "openapi_job_submit_response", response.json())
    assert "job submissions" in response.json()["errors"][0]["description"]
    assert JobRecord.objects.count() == 1


@pytest.mark.parametrize("who", ["owner", "member", "outsider"])
def test_everyone_reads_ping_diag_nodes_and_partitions_as_tenants_see_them(
    who: str, rest: Any, acme: Tenant, globex: Tenant
) -> None:
    user, org = {
        "owner": (acme.owner, acme.organization),
        "member": (acme.member, acme.organization),
        "outsider": (globex.owner, globex.organization),
    }[who]
    client = rest(user, org)
    rest(acme.member, acme.organization).submit(
        current_working_directory=f"{_workdir()}/acme", tres_per_node="gres/gpu:1"
    )
    for version in VERSIONS:
        (ping,) = client.call("GET", f"/{version}/ping", "openapi_ping_array_resp")["pings"]
        assert (ping["pinged"], ping["responding"]) == ("UP", True)
        stats = client.call("GET", f"/{version}/diag", "openapi_diag_resp")["statistics"]
        # Only its own organisation's jobs are counted.
        assert stats["jobs_running"] == (0 if who == "outsider" else 1)
        (node,) = client.call("GET", f"/{version}/nodes", "openapi_nodes_resp")["nodes"]
        assert (node["name"], node["cpus"], node["real_memory"]) == ("node01", 16, 64000)
        assert (node["gres"], node["gres_used"], node["partitions"]) == (
            "gpu:h100:1",
            "gpu:h100:1",
            ["gpu"],
        )
        text = str(node)
        for secret in ("127.0.0.1:9", "agent_url", "gpus_in_use", "pci", "uuid"):
            assert secret not in text
        assert client.call("GET", f"/{version}/node/node01/", "openapi_nodes_resp")["nodes"] == [
            node
        ]
        missing = client.call("GET", f"/{version}/node/nope", "openapi_nodes_resp", status=404)
        assert missing["errors"][0]["error_number"] == 2018
        (part,) = client.call("GET", f"/{version}/partitions/", "openapi_partition_resp")[
            "partitions"
        ]
        assert (part["name"], part["nodes"]["configured"], part["partition"]["state"]) == (
            "gpu",
            "node01",
            ["UP"],
        )
        one = client.call("GET", f"/{version}/partition/gpu", "openapi_partition_resp")
        assert one["partitions"] == [part]
        client.call("GET", f"/{version}/partition/cpu", "openapi_partition_resp", status=404)
