"""The agent's HTTP API, served by the real Starlette app (and, for the client, uvicorn)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.testclient import TestClient

from agents.api import create_app
from agents.client import AgentClient
from agents.launcher import Launcher
from scheduler.rpc.errors import Refused, Unavailable

TOKEN = "s3cret-cluster-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
Payload = Callable[..., dict[str, Any]]


@pytest.fixture
def http(launcher: Launcher) -> TestClient:
    return TestClient(create_app(launcher=launcher, token=TOKEN))


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]
)
def test_every_route_needs_the_cluster_token(http: TestClient, headers: dict[str, str]) -> None:
    for method, path in [
        ("GET", "/v1/health"),
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs/1/launch"),
        ("POST", "/v1/jobs/1/signal"),
    ]:
        response = http.request(method, path, headers=headers, json={})
        assert response.status_code == 401, (method, path)
        assert "detail" in response.json()


def test_health_names_the_node(http: TestClient) -> None:
    assert http.get("/v1/health", headers=AUTH).json() == {"ok": True, "node": "sim01"}


def test_a_launch_is_accepted_runs_and_is_listed_until_signalled(
    tmp_path: Path, http: TestClient, launcher: Launcher, reporter: Any, payload: Payload
) -> None:
    p = payload(5, "#!/bin/bash\necho ready\nsleep 60\n", workdir=str(tmp_path))
    response = http.post("/v1/jobs/5/launch", headers=AUTH, json=p)
    assert response.status_code == 202
    assert response.json() == {"accepted": True, "duplicate": False}
    again = http.post("/v1/jobs/5/launch", headers=AUTH, json=p)
    assert again.json() == {"accepted": True, "duplicate": True}

    [job] = http.get("/v1/jobs", headers=AUTH).json()["jobs"]
    assert (job["job_id"], job["attempt"]) == (5, 1)
    assert job["pid"] > 0

    body = {"attempt": 1, "signal": int(signal.SIGTERM), "kill_after_s": 5}
    signalled = http.post("/v1/jobs/5/signal", headers=AUTH, json=body)
    assert signalled.status_code == 200
    assert signalled.json() == {"delivered": True}
    assert launcher.wait(5, 1, timeout=10)
    assert reporter.finished(5)["signal"] == signal.SIGTERM
    assert http.get("/v1/jobs", headers=AUTH).json() == {"jobs": []}
    gone = http.post("/v1/jobs/5/signal", headers=AUTH, json={"attempt": 1, "signal": 15})
    assert gone.json() == {"delivered": False}


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/jobs/5/launch", b"not json"),
        ("/v1/jobs/5/launch", b"[1, 2]"),
        ("/v1/jobs/5/launch", b'{"job_id": 5}'),
        ("/v1/jobs/abc/launch", b"{}"),
        ("/v1/jobs/5/signal", b'{"attempt": 1}'),
        ("/v1/jobs/5/signal", b'{"attempt": 1, "signal": "TERM"}'),
        ("/v1/jobs/5/signal", b'{"attempt": 1, "signal": 0}'),
        ("/v1/jobs/5/signal", b'{"attempt": 1, "signal": 15, "kill_after_s": -1}'),
        ("/v1/jobs/5/signal", b'{"attempt": 1, "signal": 15, "extra": 1}'),
    ],
)
def test_a_malformed_body_is_a_400_with_an_error(http: TestClient, path: str, body: bytes) -> None:
    response = http.post(path, headers=AUTH, content=body)
    assert response.status_code == 400
    assert isinstance(response.json()["detail"], str)


def test_a_launch_whose_path_and_body_disagree_is_refused(
    tmp_path: Path, http: TestClient, payload: Payload
) -> None:
    p = payload(6, "#!/bin/bash\n", workdir=str(tmp_path))
    response = http.post("/v1/jobs/7/launch", headers=AUTH, json=p)
    assert response.status_code == 400
    assert "does not match" in response.json()["detail"]


def test_a_launch_for_another_node_is_refused(
    tmp_path: Path, http: TestClient, payload: Payload
) -> None:
    p = payload(6, "#!/bin/bash\n", workdir=str(tmp_path), node="sim09")
    response = http.post("/v1/jobs/6/launch", headers=AUTH, json=p)
    assert response.status_code == 400
    assert "sim09" in response.json()["detail"]


@pytest.fixture
def served(launcher: Launcher) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(launcher=launcher, token=TOKEN), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)
    sock.close()


def test_the_client_launches_lists_and_signals_over_http(
    tmp_path: Path, served: str, launcher: Launcher, payload: Payload
) -> None:
    with AgentClient(served, TOKEN) as client:
        assert client.health() == {"ok": True, "node": "sim01"}
        p = payload(8, "#!/bin/bash\nsleep 60\n", workdir=str(tmp_path))
        assert client.launch(p) == {"accepted": True, "duplicate": False}
        assert client.launch(p)["duplicate"] is True
        assert [j["job_id"] for j in client.jobs()] == [8]
        assert client.signal(8, attempt=1, signal=9) == {"delivered": True}
        assert launcher.wait(8, 1, timeout=10)
        assert client.jobs() == []


def test_the_client_tells_a_refusal_from_an_unreachable_agent(
    tmp_path: Path, served: str, payload: Payload
) -> None:
    with AgentClient(served, "wrong-token") as client, pytest.raises(Refused) as refused:
        client.health()
    assert refused.value.status == 401
    with AgentClient(served, TOKEN) as client, pytest.raises(Refused) as bad:
        client.signal(1, attempt=1, signal=0)
    assert bad.value.status == 400
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    unreachable = AgentClient(f"http://127.0.0.1:{port}", TOKEN, timeout=2)
    with unreachable, pytest.raises(Unavailable):
        unreachable.health()
