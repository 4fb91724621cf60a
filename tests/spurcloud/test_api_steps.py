"""Job steps through the web API (spurcloud/api/steps.py) against a real `spurctld` with
one registered node whose agent does not answer: who may run and cancel steps (owner,
member, outsider), what is refused at the edge, and that the controller records each
step and its end even when its node cannot be reached."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from rest_framework.test import APIClient

SCRIPT = "#!/bin/sh\nsleep 600\n"


def _running_job(client: APIClient, controller: Any) -> int:
    job_id = int(
        client.post("/api/v1/jobs", {"script": SCRIPT, "ntasks": 2}, format="json").json()["job_id"]
    )
    ctl = controller.client()
    try:
        deadline = time.monotonic() + 20
        while ctl.job(job_id)["state"] != "RUNNING":
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
    finally:
        ctl.close()
    return job_id


def _live(controller: Any, job_id: int) -> dict[str, Any]:
    ctl = controller.client()
    try:
        job: dict[str, Any] = ctl.job(job_id)
        return job
    finally:
        ctl.close()


def _events(response: Any) -> list[dict[str, Any]]:
    """The stream's lines (an async iterator, as the web serves it under ASGI)."""

    async def read() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    body = async_to_sync(read)()
    return [json.loads(line) for line in body.splitlines() if line]


@pytest.mark.parametrize("who", ["as_owner", "as_member"])
def test_the_jobs_user_and_an_owner_run_a_step_and_it_is_recorded(
    who: str, live_controller: Any, as_member: APIClient, request: pytest.FixtureRequest
) -> None:
    job_id = _running_job(as_member, live_controller)
    client: APIClient = request.getfixturevalue(who)
    response = client.post(
        f"/api/v1/jobs/{job_id}/steps", {"argv": ["hostname"], "ntasks": 2}, format="json"
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    first, *events = _events(response)
    io = first.pop("io")
    assert first == {"step_id": 0, "nodes": ["node01"], "tasks": [[0, "node01"], [1, "node01"]]}
    # The step's I/O credential on its node, for srun to attach, write input and signal.
    assert list(io) == ["node01"] and io["node01"].startswith(f"spur-stepio.{job_id}.1.0.node01.")
    # Its node's agent does not answer: the step fails, and says why.
    assert events and events[0]["node"] == "node01" and "error" in events[0]
    steps = _live(live_controller, job_id)["steps"]
    assert [(s["step_id"], s["name"], s["ntasks"], s["state"]) for s in steps] == [
        (0, "hostname", 2, "FAILED")
    ]


def test_a_member_runs_no_step_in_another_members_job(
    live_controller: Any, as_owner: APIClient, as_member: APIClient
) -> None:
    job_id = _running_job(as_owner, live_controller)
    response = as_member.post(f"/api/v1/jobs/{job_id}/steps", {"argv": ["id"]}, format="json")
    assert response.status_code == 403
    cancel = as_member.post(f"/api/v1/jobs/{job_id}/steps/0/cancel", {}, format="json")
    assert cancel.status_code == 403
    assert _live(live_controller, job_id)["steps"] == []


def test_an_outsider_finds_no_such_job(
    live_controller: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    job_id = _running_job(as_member, live_controller)
    response = as_outsider.post(f"/api/v1/jobs/{job_id}/steps", {"argv": ["id"]}, format="json")
    assert response.status_code == 404
    assert response.json()["detail"] == f"Job {job_id} not found."
    cancel = as_outsider.post(f"/api/v1/jobs/{job_id}/steps/0/cancel", {}, format="json")
    assert cancel.status_code == 404
    assert _live(live_controller, job_id)["steps"] == []


def test_a_step_the_allocation_cannot_hold_is_refused_and_nothing_is_recorded(
    live_controller: Any, as_member: APIClient
) -> None:
    job_id = _running_job(as_member, live_controller)
    cases = [
        ({"argv": ["x"], "nodes": 2}, "Only allocated 1 nodes asked for 2"),
        ({"argv": ["x"], "ntasks": 17}, "More processors requested than permitted"),
        ({"argv": ["x"], "ntasks": 2, "gpus_per_task": 1}, "Requested node configuration"),
    ]
    for body, message in cases:
        response = as_member.post(f"/api/v1/jobs/{job_id}/steps", body, format="json")
        assert response.status_code == 400, body
        assert message in response.json()["detail"], response.json()
    for body in ({"argv": []}, {"argv": "x"}, {"argv": ["x"], "ntasks": 0}, {}):
        assert (
            as_member.post(f"/api/v1/jobs/{job_id}/steps", body, format="json").status_code == 400
        )
    assert _live(live_controller, job_id)["steps"] == []


def test_a_step_of_a_job_that_does_not_run_is_409(
    live_controller: Any, as_member: APIClient
) -> None:
    job_id = _running_job(as_member, live_controller)
    as_member.post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    response = as_member.post(f"/api/v1/jobs/{job_id}/steps", {"argv": ["id"]}, format="json")
    assert response.status_code == 409


def test_cancelling_one_step(live_controller: Any, as_member: APIClient) -> None:
    job_id = _running_job(as_member, live_controller)
    _events(as_member.post(f"/api/v1/jobs/{job_id}/steps", {"argv": ["id"]}, format="json"))
    # Ended already (its node did not answer): cancelling it changes nothing.
    response = as_member.post(f"/api/v1/jobs/{job_id}/steps/0/cancel", {}, format="json")
    assert response.status_code == 200
    assert response.json()["steps"][0]["state"] == "FAILED"
    missing = as_member.post(f"/api/v1/jobs/{job_id}/steps/5/cancel", {}, format="json")
    assert missing.status_code == 404
    bad = as_member.post(f"/api/v1/jobs/{job_id}/steps/0/cancel", {"signal": 99}, format="json")
    assert bad.status_code == 400


def _io(response: Any) -> tuple[int, str]:
    first = _events(response)[0]
    return int(first["step_id"]), str(first["io"]["node01"])


def test_one_nodes_requests_go_only_to_the_jobs_nodes_and_say_when_its_agent_is_away(
    live_controller: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    job_id = _running_job(as_member, live_controller)
    step_id, io = _io(as_member.post(f"/api/v1/jobs/{job_id}/steps", {"argv": ["cat"]},
                                     format="json"))  # fmt: skip
    base = f"/api/v1/jobs/{job_id}/steps/{step_id}"
    piece = {"node": "node01", "io": io, "offset": 0, "data": "aGk="}
    # A node the job does not run on is no address: nothing leaves the web.
    assert as_member.post(f"{base}/input", {**piece, "node": "node02"},
                          format="json").status_code == 404  # fmt: skip
    assert as_outsider.post(f"{base}/input", piece, format="json").status_code == 404
    # The node's agent does not answer: 503 (srun tries again), the same for a resize
    # and a signal; an attach's stream says the node's stream is lost, and srun attaches
    # again.
    for path, body in (("input", piece), ("resize", {"cols": 80, "rows": 24}),
                       ("signal", {"signal": 2})):  # fmt: skip
        answer = as_member.post(f"{base}/{path}", {"node": "node01", "io": io, **body},
                                format="json")  # fmt: skip
        assert answer.status_code == 503, (path, answer.content)
    again = {"node": "node01", "io": io, "offsets": [[0, 0, 0]]}
    attached = as_member.post(f"{base}/attach", again, format="json")
    assert attached.status_code == 200
    [lost] = _events(attached)
    assert lost["node"] == "node01" and "unreachable" in lost["lost"]
    # Refused at the edge: a piece larger than a piece may be, offsets of another shape.
    big = {**piece, "data": "eA==" * 90000}
    assert as_member.post(f"{base}/input", big, format="json").status_code == 400
    bad = {"node": "node01", "io": io, "offsets": {"0": [0, 0]}}
    assert as_member.post(f"{base}/attach", bad, format="json").status_code == 400


def test_a_steps_input_counts_against_its_own_rate_limit(
    live_controller: Any, as_member: APIClient, settings: Any
) -> None:
    job_id = _running_job(as_member, live_controller)
    settings.API_STEP_IO_PER_MINUTE_PER_TOKEN = 2
    piece = {"node": "node02", "io": "x", "offset": 0}
    statuses = [
        as_member.post(f"/api/v1/jobs/{job_id}/steps/0/input", piece, format="json").status_code
        for _ in range(3)
    ]
    assert statuses == [404, 404, 429]
    # The token's other requests are not the step's input's.
    assert as_member.get("/api/v1/jobs").status_code == 200


def test_srun_records_the_end_of_a_step_it_followed_on_its_own(
    live_controller: Any, as_member: APIClient, as_owner: APIClient
) -> None:
    job_id = _running_job(as_member, live_controller)
    ctl = live_controller.client()
    try:
        created = ctl.create_step(job_id, {"argv": ["true"]}, tenant="acme")
    finally:
        ctl.close()
    step_id = created["step_id"]
    end = f"/api/v1/jobs/{job_id}/steps/{step_id}/end"
    assert as_member.post(end, {"exit_code": 3}, format="json").status_code == 200
    step = _live(live_controller, job_id)["steps"][step_id]
    assert (step["state"], step["exit_code"], step["signal"]) == ("FAILED", 3, 0)
    # Ended already: a second report changes nothing.
    assert as_owner.post(end, {"exit_code": 0}, format="json").status_code == 200
    assert _live(live_controller, job_id)["steps"][step_id]["state"] == "FAILED"
    assert as_member.post(f"/api/v1/jobs/{job_id}/steps/9/end", {"exit_code": 0},
                          format="json").status_code == 404  # fmt: skip
