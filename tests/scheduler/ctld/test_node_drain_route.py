"""POST /v1/nodes/{name}/drain and /resume on a real controller: the node dict shows the
state and reason, a drained node takes no job, bad requests are refused by status."""

from __future__ import annotations

import httpx
import pytest

from scheduler.rpc.errors import NotFound, Refused
from tests.fixtures.processes import wait_until
from tests.scheduler.core.factories import gpu_node, spec


def test_a_drained_node_shows_its_reason_and_takes_jobs_again_once_resumed(controller):
    with controller.client() as client:
        client.register_node({**gpu_node("sim01").to_dict(), "agent_url": "http://127.0.0.1:9"})
        node = client.drain_node("sim01", reason="swap GPU 3", by="ops")
        assert (node["name"], node["state"], node["reason"]) == ("sim01", "drain", "swap GPU 3")
        job_id = client.submit(spec(gpus_per_node=1).to_dict())["job_id"]
        # Once a pass has looked at it (it gives a pending job its reason), it still waits.
        wait_until(lambda: client.job(job_id)["reason"] not in ("", None), what="a pass")
        assert client.job(job_id)["state"] == "PENDING"
        node = client.resume_node("sim01", by="ops")
        # No longer drained: idle, or already holding the job (the pass that the resume
        # wakes may run before the answer's view of the node is read).
        assert node["state"] in ("idle", "mix") and node["reason"] == ""
        wait_until(lambda: client.job(job_id)["state"] == "RUNNING", what="the job to start")


def test_a_drain_without_a_reason_or_of_an_unknown_node_is_refused(controller):
    with controller.client() as client:
        client.register_node({**gpu_node("sim01").to_dict(), "agent_url": "http://127.0.0.1:9"})
        with pytest.raises(Refused, match="a drain needs a reason"):
            client.drain_node("sim01", reason="")
        with pytest.raises(NotFound, match="Invalid node name specified"):
            client.drain_node("nope", reason="x")
        with pytest.raises(NotFound):
            client.resume_node("nope")
        assert client.nodes()[0]["state"] == "idle"


def test_without_the_cluster_token_no_node_is_drained(controller):
    answer = httpx.post(f"{controller.url}/v1/nodes/sim01/drain", json={"reason": "x"})
    assert answer.status_code == 401
