"""SSH into a session (portal/session_ssh.py, agents/ssh.py): a session launched from the
portal carries its launcher's account keys; the session's page shows the command and
the node's host key to the session's user and to owners and admins, never to another
member, billing or an outsider; a user without keys is sent to the account page; the
API takes no key that is not the caller's own. And with a real controller and a real
spurd offering SSH: the launcher's key opens a shell in the session's job, as the job's
identity, and nobody else's does."""

from __future__ import annotations

import asyncio
import pwd
import shutil
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from django.utils import timezone

from agents.ssh import public_line
from scheduler.core.contract import ssh as contract
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import SSH_KEYS_MESSAGE
from spurcloud.portal import session_ssh
from spurcloud.portal.session_activity import last_session_activity
from spurcloud.portal.session_culling import idle_sessions
from spurcloud.tenants.models import MAX_SSH_KEYS_PER_USER, Membership
from spurcloud.tenants.services import add_member, add_ssh_key
from spurcloud.tenants.sshkeys import ACCEPTED_TYPES, MAX_KEY_LINE
from tests.agents.spurd import Courier, RunningAgent, reachable_dir, start_agent
from tests.fixtures.processes import Processes, free_port, wait_until
from tests.spurcloud.conftest import api_client, make_user
from tests.spurcloud.portal.conftest import EVERYONE, browser, record

HOST_KEY = public_line(asyncssh.generate_private_key("ssh-ed25519"))
MAX_KEY = asyncssh.generate_private_key("ssh-ed25519")  # max's (the member's) private key
MAX_LINE = public_line(MAX_KEY)
OWNER_KEY = asyncssh.generate_private_key("ssh-ed25519")
SESSION = {"qos": "interactive", "comment": "spur-session:shell", "script": "#!/bin/sh\n"}


@pytest.fixture
def ssh_node(controller: Any, settings: Any) -> str:
    """A node (node02) whose agent says it offers SSH, registered with a real controller."""
    settings.SPUR_CONTROLLER_URLS = [controller.url]
    settings.SPUR_CLUSTER_TOKEN = controller.token
    client = controller.client()
    try:
        client.register_node(
            {
                "name": "node02",
                "cpus": 8,
                "memory_mb": 32000,
                "agent_url": "http://127.0.0.1:9",
                "labels": {
                    contract.ADDRESS_LABEL: "node02.example:2222",
                    contract.HOST_KEY_LABEL: HOST_KEY,
                },
            }
        )
    finally:
        client.close()
    return "node02"


def _running_session(job_id: int, *, user: str = "max", node: str = "node02",
                     keys: list[str] | None = None) -> None:  # fmt: skip
    record(job_id, user=user, state="RUNNING")
    spec = {**SESSION, "ssh_keys": [MAX_LINE] if keys is None else keys}
    JobRecord.objects.filter(job_id=job_id).update(
        spec=spec, qos="interactive", nodes=[node], start_time="2026-12-01T09:00:00Z"
    )


def _ssh_block(who: Any, job_id: int) -> str:
    # The status fragment, as htmx asks for it (outside htmx it redirects to the page).
    page = browser(who).get(f"/sessions/{job_id}/status", headers={"HX-Request": "true"})
    assert page.status_code == 200
    text = page.content.decode()
    return text[text.index('id="session-ssh"') :] if 'id="session-ssh"' in text else ""


# -- the session's page ---------------------------------------------------------------------


def test_the_sessions_user_sees_the_command_and_the_nodes_host_key(
    people: dict[str, Any], ssh_node: str
) -> None:
    _running_session(7)
    block = _ssh_block(people["member"], 7)
    assert "ssh -p 2222 job-7@node02.example" in block
    assert f"[node02.example]:2222 {HOST_KEY}" in block
    assert session_ssh.NodeSsh("node02.example", 2222, HOST_KEY).fingerprint in block
    assert "1 SSH key " in block  # fixed at launch, and said so
    # The whole page holds the same (it is the status fragment's first rendering).
    assert "job-7@node02.example" in browser(people["member"]).get("/sessions/7/").content.decode()


@pytest.mark.parametrize("who", [*EVERYONE, "other member"])
def test_who_sees_the_details_of_a_members_session(
    who: str, people: dict[str, Any], ssh_node: str
) -> None:
    _running_session(7)
    if who == "other member":
        viewer = make_user("mia")
        owner = people["owner"]
        add_member(organization=Membership.objects.get(user=owner).organization, user=viewer,
                   role=Membership.Role.MEMBER, by=owner)  # fmt: skip
    else:
        viewer = people[who]
    if who == "outsider":
        assert browser(viewer).get("/sessions/7/status").status_code == 404
        return
    block = _ssh_block(viewer, 7)
    if who in ("owner", "admin"):
        assert "takes only max's keys" in block and "job-7@node02.example" in block
    elif who == "member":
        assert "job-7@node02.example" in block and "takes only" not in block
    else:  # billing, and a member in someone else's session: no SSH of theirs
        assert block == ""


def test_a_user_whose_session_carries_no_key_is_sent_to_the_account_page(
    people: dict[str, Any], ssh_node: str
) -> None:
    _running_session(8, keys=[])
    block = _ssh_block(people["member"], 8)
    assert 'href="/account/"' in block and "ssh -p" not in block


@pytest.mark.parametrize(
    "case", ["pending", "node without ssh", "node says nonsense", "controller down"]
)
def test_nothing_is_said_of_ssh_where_there_is_none(
    case: str, people: dict[str, Any], ssh_node: str, controller: Any, settings: Any
) -> None:
    if case == "pending":
        _running_session(9)
        JobRecord.objects.filter(job_id=9).update(state="PENDING", nodes=[])
    elif case == "node without ssh":
        _running_session(9, node="node03")
        client = controller.client()
        client.register_node({"name": "node03", "cpus": 8, "memory_mb": 32000,
                              "agent_url": "http://127.0.0.1:9"})  # fmt: skip
        client.close()
    elif case == "node says nonsense":
        assert session_ssh.node_ssh({contract.ADDRESS_LABEL: "x;rm:22",
                                     contract.HOST_KEY_LABEL: HOST_KEY}) is None  # fmt: skip
        assert session_ssh.node_ssh({contract.ADDRESS_LABEL: "n:22",
                                     contract.HOST_KEY_LABEL: "ssh-ed25519 x"}) is None  # fmt: skip
        return
    else:
        _running_session(9)
        settings.SPUR_CONTROLLER_URLS = ["http://127.0.0.1:9"]
    assert _ssh_block(people["member"], 9) == ""


def test_the_known_hosts_line_and_command_follow_the_port() -> None:
    at_22 = session_ssh.NodeSsh("n1.example", 22, HOST_KEY)
    assert at_22.command(5) == "ssh job-5@n1.example"
    assert at_22.known_hosts == f"n1.example {HOST_KEY}"
    v6 = session_ssh.node_ssh({contract.ADDRESS_LABEL: "[::1]:2222",
                               contract.HOST_KEY_LABEL: HOST_KEY})  # fmt: skip
    assert v6 is not None and v6.known_hosts == f"[::1]:2222 {HOST_KEY}"


# -- launching, and the API -----------------------------------------------------------------


def test_a_session_launched_here_carries_the_launchers_keys_and_only_theirs(
    people: dict[str, Any], live_controller: Any
) -> None:
    add_ssh_key(user=people["member"], name="laptop", public_key=MAX_LINE + " max@laptop")
    add_ssh_key(user=people["owner"], name="desk", public_key=public_line(OWNER_KEY))
    client = browser(people["member"])
    page = client.get("/launch/").content.decode()
    key = page.split('name="session-idempotency_key" value="')[1][:32]
    data = {"session-idempotency_key": key, "session-template": "shell", "session-gpus": "1",
            "session-max_minutes": "30"}  # fmt: skip
    response = client.post("/sessions/launch", data)
    assert response.status_code == 302
    job_id = int(response["Location"].strip("/").rsplit("/", 1)[-1])
    spec = JobRecord.objects.get(job_id=job_id).spec
    assert spec is not None and spec["ssh_keys"] == [MAX_LINE]  # without its comment
    assert controller_client().job(job_id)["spec"]["ssh_keys"] == [MAX_LINE]


def test_the_api_takes_no_key_that_is_not_the_callers_own(
    people: dict[str, Any], live_controller: Any
) -> None:
    member = people["member"]
    organization = Membership.objects.get(user=member).organization
    api = api_client(member, organization)
    job = {"script": "#!/bin/sh\nsleep 1\n", "gpus": 1}
    refused = api.post("/api/v1/jobs", {**job, "ssh_keys": [public_line(OWNER_KEY)]},
                       format="json")  # fmt: skip
    assert refused.status_code == 400 and refused.json()["detail"] == SSH_KEYS_MESSAGE
    bad = api.post("/api/v1/jobs", {**job, "ssh_keys": ["ssh-ed25519 AAAA x"]}, format="json")
    assert bad.status_code == 400 and "without options or comment" in bad.json()["detail"]
    add_ssh_key(user=member, name="laptop", public_key=MAX_LINE)
    taken = api.post("/api/v1/jobs", {**job, "ssh_keys": [MAX_LINE]}, format="json")
    assert taken.status_code == 201, taken.json()


def test_an_accounts_keys_all_fit_in_a_job() -> None:
    assert MAX_SSH_KEYS_PER_USER <= contract.MAX_KEYS
    assert set(ACCEPTED_TYPES) == set(contract.KEY_TYPES)
    assert MAX_KEY_LINE <= contract.MAX_KEY_LINE


# -- through a real agent that offers SSH ----------------------------------------------------


@pytest.fixture
def node(controller: Any, settings: Any, tmp_path: Path) -> Iterator[RunningAgent]:
    """A real spurd (node01, simulated GPUs) with SSH on, registered with the controller."""
    settings.SPUR_CONTROLLER_URLS = [controller.url]
    settings.SPUR_CLUSTER_TOKEN = controller.token
    procs = Processes(tmp_path / "agent-logs")
    work_root = reachable_dir()
    try:
        yield start_agent(tmp_path, procs, name="node01", token=controller.token,
                          controllers=[controller.url], work_root=work_root,
                          args=("--ssh-listen", f"127.0.0.1:{free_port()}"))  # fmt: skip
    finally:
        procs.stop_all()
        shutil.rmtree(work_root, ignore_errors=True)


@pytest.mark.django_db(transaction=True)
def test_the_launchers_key_opens_a_shell_in_the_session_as_the_jobs_identity(
    people: dict[str, Any], node: RunningAgent, controller: Any, tmp_path: Path, settings: Any
) -> None:
    member = people["member"]
    add_ssh_key(user=member, name="laptop", public_key=MAX_LINE)
    add_ssh_key(user=people["owner"], name="desk", public_key=public_line(OWNER_KEY))
    client = browser(member)
    page = client.get("/launch/").content.decode()
    key = page.split('name="session-idempotency_key" value="')[1][:32]
    response = client.post("/sessions/launch", {
        "session-idempotency_key": key, "session-template": "shell", "session-gpus": "1",
        "session-max_minutes": "30"})  # fmt: skip
    job_id = int(response["Location"].strip("/").rsplit("/", 1)[-1])
    Courier(tmp_path / "broker", controller.token).deliver(job_id)
    wait_until(lambda: controller_client().job(job_id)["state"] == "RUNNING", timeout=30,
               what="the session")  # fmt: skip
    JobRecord.objects.filter(job_id=job_id).update(state="RUNNING", nodes=["node01"])
    (labels,) = [n["labels"] for n in controller_client().nodes() if n["name"] == "node01"]
    reached = session_ssh.node_ssh(labels)
    assert reached is not None and reached.host == "127.0.0.1"
    block = _ssh_block(member, job_id)
    assert reached.command(job_id) in block and reached.known_hosts in block

    async def login(key: asyncssh.SSHKey) -> Any:
        async with asyncssh.connect(
            reached.host, reached.port, username=f"job-{job_id}", client_keys=[key],
            known_hosts=asyncssh.import_known_hosts(reached.known_hosts + "\n"),
            agent_path=None,
        ) as conn:  # fmt: skip
            return await conn.run("id -u; echo $SLURM_JOB_ID $SPUR_USER")

    said = asyncio.run(asyncio.wait_for(login(MAX_KEY), 60))
    identity = pwd.getpwnam("spur-acme").pw_uid if _is_root() else None
    uid, rest = said.stdout.split("\n", 1)
    assert rest.strip() == f"{job_id} max" and said.exit_status == 0
    if identity is not None:
        assert int(uid) == identity != 0
    with pytest.raises(asyncssh.PermissionDenied):  # the owner's key is not the launcher's
        asyncio.run(asyncio.wait_for(login(OWNER_KEY), 60))
    # Used over SSH is used: idle culling asks the node, and leaves the session running.
    settings.SPUR_SESSION_IDLE_MINUTES = 30
    JobRecord.objects.filter(job_id=job_id).update(
        start_time=timezone.now() - timedelta(minutes=45)
    )
    record = JobRecord.objects.get(job_id=job_id)
    assert set(session_ssh.ssh_activity([record])) == {job_id}
    assert idle_sessions() == []
    used = last_session_activity(job_id)
    assert used is not None and time.time() - used < 120


def _is_root() -> bool:
    import os

    return os.geteuid() == 0
