"""`POST /v1/launches`: several launches for one agent in one request (the controller
batches a pass's launches per node). Each is checked as a single launch is, started in
order, and answered on its own: a refused one refuses nothing else, and a batch sent
again is a batch of duplicates."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agents.api import MAX_LAUNCH_BATCH, create_app
from agents.credentials import NodeCredential
from agents.launcher import Launcher
from scheduler.rpc import signatures
from tests.agents.conftest import RecordingReporter, make_payload

SIGNING_KEY = b"the controllers' key"
TOKEN = "cluster-token"


@pytest.fixture
def client(tmp_path: Path, launcher: Launcher) -> TestClient:
    credential = NodeCredential(tmp_path / "credential", "sim01")
    credential.store(signatures.node_key(SIGNING_KEY, "sim01").hex())
    app = create_app(launcher=launcher, token=TOKEN, credential=credential)
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})


def signed(job_id: int, script: str, workdir: Path, *, key: bytes = SIGNING_KEY) -> dict[str, Any]:
    payload = make_payload(job_id, script, workdir=str(workdir))
    payload["signature"] = signatures.sign(
        signatures.node_key(key, "sim01"),
        "launch",
        signatures.launch_fields(payload),
        expires=time.time() + 60,
    )
    return payload


def test_a_batch_starts_its_launches_in_order_and_answers_each(
    workspace: Path, launcher: Launcher, client: TestClient
) -> None:
    batch = [signed(j, "#!/bin/sh\nsleep 60\n", workspace) for j in (53, 51, 52)]
    answer = client.post("/v1/launches", json={"launches": batch})
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"] == [
        {"job_id": j, "attempt": 1, "accepted": True, "duplicate": False} for j in (53, 51, 52)
    ]
    assert [j["job_id"] for j in launcher.running()] == [53, 51, 52]


def test_a_forged_launch_is_refused_and_its_neighbours_run(
    workspace: Path, launcher: Launcher, client: TestClient, reporter: RecordingReporter
) -> None:
    tmp_path = workspace
    marker = workspace / "forged-ran"
    forged = signed(62, f"#!/bin/sh\ntouch {marker}\n", tmp_path, key=b"not the signing key")
    altered = signed(63, "#!/bin/sh\ntrue\n", tmp_path)
    altered["job"]["spec"]["script"] = f"#!/bin/sh\ntouch {marker}\n"
    batch = [
        signed(61, "#!/bin/sh\ntrue\n", tmp_path),
        forged,
        altered,
        "not a launch",
        signed(64, "#!/bin/sh\ntrue\n", tmp_path),
    ]
    answer = client.post("/v1/launches", json={"launches": batch})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r.get("job_id") for r in results] == [61, 62, 63, None, 64]
    assert [r.get("accepted") for r in results] == [True, None, None, None, True]
    assert [(r["error"]["status"], r["error"]["code"]) for r in results[1:4]] == [
        (400, "bad_signature"),
        (400, "bad_signature"),
        (400, "bad_request"),
    ]
    assert launcher.wait(61, 1, timeout=10) and launcher.wait(64, 1, timeout=10)
    assert reporter.finished(61)["exit_code"] == reporter.finished(64)["exit_code"] == 0
    assert not marker.exists()
    assert {j["job_id"] for j in launcher.running()} <= {61, 64}


def test_a_batch_delivered_again_is_a_batch_of_duplicates(
    workspace: Path, launcher: Launcher, client: TestClient
) -> None:
    batch = [signed(j, "#!/bin/sh\nsleep 60\n", workspace) for j in (71, 72)]
    first = client.post("/v1/launches", json={"launches": batch}).json()["results"]
    again = client.post("/v1/launches", json={"launches": batch}).json()["results"]
    assert [r["duplicate"] for r in first] == [False, False]
    assert [r["duplicate"] for r in again] == [True, True]
    assert sorted(j["job_id"] for j in launcher.running()) == [71, 72]  # each runs once


@pytest.mark.parametrize(
    "body",
    [{}, {"launches": []}, {"launches": {}}, {"launches": [{}] * (MAX_LAUNCH_BATCH + 1)}],
)
def test_a_batch_that_is_not_a_list_of_launches_is_refused(
    launcher: Launcher, client: TestClient, body: dict[str, Any]
) -> None:
    answer = client.post("/v1/launches", json=body)
    assert answer.status_code == 400
    assert launcher.running() == []


def test_a_batch_before_the_node_registered_is_unavailable_launch_by_launch(
    tmp_path: Path, launcher: Launcher
) -> None:
    empty = NodeCredential(tmp_path / "none", "sim01")
    app = create_app(launcher=launcher, token=TOKEN, credential=empty)
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    batch = [signed(j, "#!/bin/sh\ntrue\n", tmp_path) for j in (81, 82)]
    results = client.post("/v1/launches", json={"launches": batch}).json()["results"]
    assert [r["error"]["status"] for r in results] == [503, 503]  # the worker retries them
    assert launcher.running() == []


def test_a_launch_twice_in_one_batch_starts_once_and_each_copy_is_answered(
    workspace: Path, launcher: Launcher, client: TestClient
) -> None:
    """The batch's launches start side by side, but each is admitted in the order sent:
    the copy of a launch is a duplicate, not a second start."""
    first = signed(91, "#!/bin/sh\nsleep 60\n", workspace)
    batch = [first, dict(first), signed(92, "#!/bin/sh\nsleep 60\n", workspace)]
    results = client.post("/v1/launches", json={"launches": batch}).json()["results"]
    answered = [(r["job_id"], r["duplicate"]) for r in results]
    assert answered == [(91, False), (91, True), (92, False)]
    assert [j["job_id"] for j in launcher.running()] == [91, 92]
