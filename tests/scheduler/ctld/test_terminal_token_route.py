"""POST /v1/jobs/{id}/terminal/token (scheduler/ctld/terminals.py) on a real controller:
a token for the job's node that the node's agent accepts, for the job's organisation
only, and only while the job runs."""

from __future__ import annotations

import time

import httpx
import pytest

from scheduler.client import ControllerClient
from scheduler.rpc import terminal_tokens
from scheduler.rpc.errors import Conflict, NotFound, Refused, Unauthorized
from tests.scheduler.core.factories import gpu_node, spec


def _running(client: ControllerClient, job_id: int) -> dict:
    deadline = time.monotonic() + 10
    while client.job(job_id)["state"] != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.job(job_id)


def test_the_token_is_for_the_jobs_node_and_organisation(controller):
    with controller.client() as client:
        registered = client.register_node(
            {**gpu_node("sim01").to_dict(), "agent_url": "http://127.0.0.1:9"}
        )
        credential = bytes.fromhex(registered["credential"])
        job = _running(client, client.submit(spec().to_dict())["job_id"])
        answer = client.terminal_token(job["job_id"], tenant="acme", user="alice")
        assert (answer["node"], answer["agent_url"]) == ("sim01", "http://127.0.0.1:9")
        runs = {job["job_id"]: (job["attempt"], "acme")}
        fields = terminal_tokens.check(
            credential, answer["token"], node="sim01", jobs=runs, now=time.time()
        )
        assert (fields["tenant"], fields["user"]) == ("acme", "alice")
        with pytest.raises(Unauthorized, match="expired"):
            terminal_tokens.check(
                credential, answer["token"], node="sim01", jobs=runs, now=answer["expires"] + 1
            )
        # Another organisation asking for acme's job: the same answer as a missing job.
        with pytest.raises(NotFound):
            client.terminal_token(job["job_id"], tenant="globex", user="gus")
        with pytest.raises(Refused):
            client.terminal_token(job["job_id"], tenant="acme", user="")
        held = client.submit(spec(hold=True).to_dict())["job_id"]
        with pytest.raises(Conflict):  # not running: no terminal
            client.terminal_token(held, tenant="acme", user="alice")


def test_without_the_cluster_token_nothing_is_minted(controller):
    answer = httpx.post(
        f"{controller.url}/v1/jobs/1/terminal/token", json={"tenant": "acme", "user": "a"}
    )
    assert answer.status_code == 401


def test_the_service_token_is_of_its_own_kind_for_the_same_job(controller):
    with controller.client() as client:
        registered = client.register_node(
            {**gpu_node("sim01").to_dict(), "agent_url": "http://127.0.0.1:9"}
        )
        credential = bytes.fromhex(registered["credential"])
        job = _running(client, client.submit(spec().to_dict())["job_id"])
        answer = client.service_token(job["job_id"], tenant="acme", user="alice")
        assert answer["token"].startswith("spur-svc.") and answer["node"] == "sim01"
        runs = {job["job_id"]: (job["attempt"], "acme")}
        fields = terminal_tokens.check(
            credential,
            answer["token"],
            node="sim01",
            jobs=runs,
            now=time.time(),
            kind=terminal_tokens.SERVICE,
        )
        assert fields["user"] == "alice"
        with pytest.raises(Unauthorized):  # not a terminal token
            terminal_tokens.check(credential, answer["token"], node="sim01", jobs=runs, now=0)
        with pytest.raises(NotFound):
            client.service_token(job["job_id"], tenant="globex", user="gus")
