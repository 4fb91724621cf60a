"""An array's pending tasks are one record in the controller and one row in the history
(`array_tasks`, sacct's `17_[0-3]`), until a task leaves them; a task still among them is
acted on by its own job id like any job. Against a real `spurctld` with one node."""

from __future__ import annotations

import time
from typing import Any

from rest_framework.test import APIClient

from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.tasks import job_events
from tests.spurcloud.test_api_controller import SCRIPT, _drain_tasks


def _array(client: APIClient) -> int:
    response = client.post(
        "/api/v1/jobs", {"script": SCRIPT, "array": "0-3", "hold": True}, format="json"
    )
    assert response.status_code == 201, response.json()
    job = response.json()
    assert (job["array_task_id"], job["array_tasks"]) == (None, "0-3")
    return int(job["job_id"])


def test_a_task_of_an_arrays_remainder_is_acted_on_by_its_owners_alone(
    live_controller: Any, as_owner: APIClient, as_member: APIClient, as_outsider: APIClient
) -> None:
    first = _array(as_member)
    record = JobRecord.objects.get(job_id=first)
    assert (record.array_tasks, record.array_task_id) == ("0-3", None)
    assert not JobRecord.objects.filter(job_id=first + 2).exists()
    # The live queue lists each task with its own job id.
    queue = as_member.get(f"/api/v1/queue?id={first}").json()["results"]
    assert [(j["job_id"], j["array_task_id"]) for j in queue] == [(first + i, i) for i in range(4)]
    released = as_member.post(f"/api/v1/jobs/{first + 2}/release", format="json")
    assert released.status_code == 200, released.json()
    assert (released.json()["array_task_id"], released.json()["array_tasks"]) == (2, "")
    assert as_outsider.post(f"/api/v1/jobs/{first + 1}/cancel", format="json").status_code == 404
    theirs = _array(as_owner)
    refused = as_member.post(f"/api/v1/jobs/{theirs + 1}/cancel", format="json")
    assert refused.status_code == 403
    assert as_owner.post(f"/api/v1/jobs/{first + 3}/cancel", format="json").status_code == 200


def test_the_history_keeps_one_row_for_the_remainder_and_one_per_task_that_left_it(
    live_controller: Any, as_member: APIClient
) -> None:
    first = _array(as_member)
    as_member.post(f"/api/v1/jobs/{first + 2}/release", format="json")
    cancelled = as_member.post(f"/api/v1/jobs/{first}/cancel", format="json").json()
    tasks: list[tuple[str, Any]] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tasks += _drain_tasks(live_controller.config_path.parent / "broker")
        seqs = [e["seq"] for name, batch in tasks if name == "spur.job_events" for e in batch]
        if seqs and max(seqs) >= cancelled["seq"]:
            break
        time.sleep(0.05)
    events = [e for name, batch in tasks if name == "spur.job_events" for e in batch]
    for payload in reversed(events):  # the worst order: newest first
        job_events([payload])
    rows = {
        r.job_id: (r.array_task_id, r.array_tasks, r.state)
        for r in JobRecord.objects.filter(array_job_id=first)
    }
    # Task 0 left (cancelled) and took its row; the rest moved on to task 1's job id;
    # task 2, released, has its own (the node may have started it since).
    assert rows.pop(first + 2)[:2] == (2, "")
    assert rows == {first: (0, "", "CANCELLED"), first + 1: (None, "1,3", "PENDING")}
    history = as_member.get(f"/api/v1/jobs?id={first}").json()["results"]
    assert sorted(j["array_tasks"] for j in history) == ["", "", "1,3"]
