"""The agent runs only what the controller signed for it: a launch or a signal that is
unsigned, forged, altered, expired or meant for another node is refused, and nothing runs
before the node holds its credential."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agents.api import create_app
from agents.credentials import NodeCredential
from agents.launcher import Launcher
from agents.supervisor import Lease
from scheduler.rpc import signatures
from tests.agents.conftest import make_payload

SIGNING_KEY = b"the controllers' key"
TOKEN = "cluster-token"


@pytest.fixture
def credential(tmp_path: Path) -> NodeCredential:
    held = NodeCredential(tmp_path / "credential", "sim01")
    held.store(signatures.node_key(SIGNING_KEY, "sim01").hex())
    return held


def client_of(launcher: Launcher, credential: NodeCredential) -> TestClient:
    app = create_app(launcher=launcher, token=TOKEN, credential=credential)
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})


def sign_launch(payload: dict[str, Any], *, key: bytes = SIGNING_KEY, ttl: float = 60) -> None:
    credential = signatures.node_key(key, str(payload["node"]))
    payload["signature"] = signatures.sign(
        credential, "launch", signatures.launch_fields(payload), expires=time.time() + ttl
    )


def test_a_signed_launch_runs(
    tmp_path: Path, launcher: Launcher, credential: NodeCredential
) -> None:
    payload = make_payload(41, "#!/bin/sh\ntrue\n", workdir=str(tmp_path))
    sign_launch(payload)
    answer = client_of(launcher, credential).post("/v1/jobs/41/launch", json=payload)
    assert answer.status_code == 202, answer.text
    assert launcher.wait(41, 1, timeout=10)


@pytest.mark.parametrize(
    ("tamper", "code"),
    [
        ("unsigned", "unsigned"),
        ("forged", "bad_signature"),
        ("altered script", "bad_signature"),
        ("expired", "expired"),
    ],
)
def test_a_launch_not_signed_for_this_node_runs_nothing(
    tmp_path: Path, launcher: Launcher, credential: NodeCredential, tamper: str, code: str
) -> None:
    marker = tmp_path / "ran"
    payload = make_payload(42, "#!/bin/sh\ntrue\n", workdir=str(tmp_path))
    if tamper == "forged":
        sign_launch(payload, key=b"a leaked cluster token is not the signing key")
    elif tamper == "expired":
        sign_launch(payload, ttl=-1)
    elif tamper == "altered script":
        sign_launch(payload)
        payload["job"]["spec"]["script"] = f"#!/bin/sh\ntouch {marker}\n"
    answer = client_of(launcher, credential).post("/v1/jobs/42/launch", json=payload)
    assert answer.status_code == 400
    assert answer.json()["code"] == code
    assert not marker.exists() and launcher.running() == []


def test_nothing_runs_before_the_node_holds_its_credential(
    tmp_path: Path, launcher: Launcher
) -> None:
    empty = NodeCredential(tmp_path / "none", "sim01")
    payload = make_payload(43, "#!/bin/sh\ntrue\n", workdir=str(tmp_path))
    sign_launch(payload)
    answer = client_of(launcher, empty).post("/v1/jobs/43/launch", json=payload)
    assert answer.status_code == 503  # the worker retries until the node registered


def test_a_signal_must_be_signed_too(
    tmp_path: Path, launcher: Launcher, credential: NodeCredential
) -> None:
    client = client_of(launcher, credential)
    unsigned = client.post("/v1/jobs/44/signal", json={"attempt": 1, "signal": 9})
    assert (unsigned.status_code, unsigned.json()["code"]) == (400, "unsigned")
    fields = signatures.signal_fields(
        {"attempt": 1, "node": "sim01", "signal": 9, "kill_after_s": None}, 44
    )
    signature = signatures.sign(
        signatures.node_key(SIGNING_KEY, "sim01"), "signal", fields, expires=time.time() + 60
    )
    signed = client.post(
        "/v1/jobs/44/signal", json={"attempt": 1, "signal": 9, "signature": signature}
    )
    assert signed.status_code == 200 and signed.json() == {"delivered": False}


def test_the_credential_is_kept_private(tmp_path: Path) -> None:
    held = NodeCredential(tmp_path / "credential", "sim01")
    held.store(signatures.node_key(SIGNING_KEY, "sim01").hex())
    assert (tmp_path / "credential").stat().st_mode & 0o777 == 0o600
    assert NodeCredential(tmp_path / "credential", "sim01").key == held.key


def test_a_launch_from_before_the_node_was_lost_is_refused_as_stale(
    tmp_path: Path, launcher: Launcher, credential: NodeCredential
) -> None:
    # The heartbeat told the agent the node's epoch is 2 (it was declared lost twice);
    # a launch made in epoch 1 waited in a worker: its job was ended when the node was
    # lost, and its GPUs may be another job's now.
    launcher.lease = Lease()
    launcher.lease.renew(sent_at=time.monotonic(), lease_s=60, epoch=2)
    client = client_of(launcher, credential)
    stale = make_payload(43, "#!/bin/sh\ntrue\n", workdir=str(tmp_path))
    stale["epoch"] = 1
    sign_launch(stale)
    answer = client.post("/v1/jobs/43/launch", json=stale)
    assert answer.status_code == 409, answer.text
    assert "declared lost" in answer.json()["detail"]
    assert launcher.running() == []
    # The epoch is signed: a worker cannot make a stale launch current.
    stale["epoch"] = 2
    altered = client.post("/v1/jobs/43/launch", json=stale)
    assert (altered.status_code, altered.json()["code"]) == (400, "bad_signature")
    current = make_payload(44, "#!/bin/sh\ntrue\n", workdir=str(tmp_path))
    current["epoch"] = 2
    sign_launch(current)
    assert client.post("/v1/jobs/44/launch", json=current).status_code == 202
    assert launcher.wait(44, 1, timeout=10)
