"""The agent's HTTP API, served by the real Starlette app (and, for the client, uvicorn)."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agents.api import create_app
from agents.client import AgentClient
from agents.launcher import Launcher, LaunchRequest
from scheduler.rpc.errors import NotFound, Refused, Unavailable
from tests.fixtures.served import served_in_thread

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
        ("GET", "/v1/jobs/1/output"),
    ]:
        response = http.request(method, path, headers=headers, json={})
        assert response.status_code == 401, (method, path)
        assert "detail" in response.json()


def test_health_names_the_node(http: TestClient) -> None:
    assert http.get("/v1/health", headers=AUTH).json() == {"ok": True, "node": "sim01"}


def test_a_launch_is_accepted_runs_and_is_listed_until_signalled(
    http: TestClient, launcher: Launcher, reporter: Any, payload: Payload
) -> None:
    p = payload(5, "#!/bin/bash\necho ready\nsleep 60\n")
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
    http: TestClient, payload: Payload
) -> None:
    p = payload(6, "#!/bin/bash\n")
    response = http.post("/v1/jobs/7/launch", headers=AUTH, json=p)
    assert response.status_code == 400
    assert "does not match" in response.json()["detail"]


def test_a_launch_for_another_node_is_refused(http: TestClient, payload: Payload) -> None:
    p = payload(6, "#!/bin/bash\n", node="sim09")
    response = http.post("/v1/jobs/6/launch", headers=AUTH, json=p)
    assert response.status_code == 400
    assert "sim09" in response.json()["detail"]


@pytest.fixture
def served(launcher: Launcher) -> Iterator[str]:
    with served_in_thread(create_app(launcher=launcher, token=TOKEN)) as url:
        yield url


def test_the_client_launches_lists_and_signals_over_http(
    served: str, launcher: Launcher, payload: Payload
) -> None:
    with AgentClient(served, TOKEN) as client:
        assert client.health() == {"ok": True, "node": "sim01"}
        p = payload(8, "#!/bin/bash\nsleep 60\n")
        assert client.launch(p) == {"accepted": True, "duplicate": False}
        assert client.launch(p)["duplicate"] is True
        assert [j["job_id"] for j in client.jobs()] == [8]
        assert client.signal(8, attempt=1, signal=9) == {"delivered": True}
        assert launcher.wait(8, 1, timeout=10)
        assert client.jobs() == []


def test_the_client_tells_a_refusal_from_an_unreachable_agent(served: str) -> None:
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


# -- reading a job's output back ------------------------------------------------------


def _run(launcher: Launcher, payload: Payload, job_id: int, script: str, **kw: Any) -> None:
    launcher.launch(LaunchRequest.from_payload(payload(job_id, script, **kw)))
    assert launcher.wait(job_id, kw.get("attempt", 1), timeout=10)


def test_the_output_route_answers_a_piece_of_a_jobs_output_and_where_to_go_on(
    http: TestClient, launcher: Launcher, payload: Payload
) -> None:
    script = "#!/bin/bash\nprintf 'hello\\nw\\xc3\\xb6rld\\n'\necho oops >&2\n"
    _run(launcher, payload, 40, script, stderr="err-%j.txt")
    whole = http.get("/v1/jobs/40/output", headers=AUTH).json()
    assert whole == {
        "job_id": 40,
        "attempt": 1,
        "stream": "stdout",
        "offset": 0,
        "next_offset": 13,
        "size": 13,
        "data": "hello\nwörld\n",
        "running": False,
    }
    piece = http.get("/v1/jobs/40/output?offset=6&limit=3", headers=AUTH).json()
    assert (piece["data"], piece["next_offset"]) == ("wö", 9)
    cut = http.get("/v1/jobs/40/output?offset=6&limit=2", headers=AUTH).json()
    assert (cut["data"], cut["next_offset"]) == ("w", 7)  # never half a character
    beyond = http.get("/v1/jobs/40/output?offset=500", headers=AUTH).json()
    assert (beyond["data"], beyond["next_offset"], beyond["size"]) == ("", 500, 13)
    errors = http.get("/v1/jobs/40/output?stream=stderr", headers=AUTH).json()
    assert (errors["stream"], errors["data"]) == ("stderr", "oops\n")


def test_the_output_of_a_running_job_says_it_runs(
    http: TestClient, launcher: Launcher, payload: Payload
) -> None:
    launcher.launch(LaunchRequest.from_payload(payload(41, "#!/bin/bash\necho ready\nsleep 60\n")))
    deadline = time.monotonic() + 10
    while http.get("/v1/jobs/41/output", headers=AUTH).json()["data"] != "ready\n":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert http.get("/v1/jobs/41/output", headers=AUTH).json()["running"] is True
    launcher.signal(41, 1, signal.SIGKILL)
    assert launcher.wait(41, 1, timeout=10)
    assert http.get("/v1/jobs/41/output", headers=AUTH).json()["running"] is False


def test_the_output_of_a_job_that_could_not_start_is_why(
    http: TestClient, launcher: Launcher, payload: Payload
) -> None:
    _run(launcher, payload, 42, "#!/bin/bash\ntrue\n", stdout="/etc/passwd")
    answer = http.get("/v1/jobs/42/output", headers=AUTH).json()
    assert "outside the workspace" in answer["data"]
    assert "root:" not in answer["data"]


@pytest.mark.parametrize(
    "stdout, plant",
    [
        ("slurm-%j.out", 'ln -sf /etc/passwd "$PWD/slurm-$SLURM_JOB_ID.out"'),
        ("logs/passwd", "mv logs logs.old && ln -s /etc logs"),
    ],
)
def test_the_output_route_never_follows_a_link_the_job_planted(
    http: TestClient,
    launcher: Launcher,
    payload: Payload,
    workspace: Path,
    put: Any,
    stdout: str,
    plant: str,
) -> None:
    put(workspace / "logs", None)
    _run(launcher, payload, 43, f"#!/bin/bash\necho mine\n{plant}\n", workdir=".", stdout=stdout)
    answer = http.get("/v1/jobs/43/output", headers=AUTH).json()
    assert "root:" not in answer["data"]
    assert answer["size"] < 100


def test_the_output_is_served_after_the_agent_restarts(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload
) -> None:
    _run(launcher, payload, 44, "#!/bin/bash\necho kept\n")
    _run(launcher, payload, 44, "#!/bin/bash\necho second attempt\n", attempt=2)
    again = Launcher(
        node="sim01",
        spool_dir=tmp_path / "spool",
        reporter=reporter,
        work_root=launcher.workspaces.root,
        identities=launcher.identities,
    )
    answer = TestClient(create_app(launcher=again, token=TOKEN)).get(
        "/v1/jobs/44/output", headers=AUTH
    )
    # A requeued job appends to the same file, as Slurm does.
    assert answer.json()["attempt"] == 2
    assert answer.json()["data"] == "kept\nsecond attempt\n"


@pytest.mark.parametrize(
    "query, status",
    [
        ("", 404),
        ("?stream=stdin", 400),
        ("?offset=-1", 400),
        ("?limit=lots", 400),
    ],
)
def test_the_output_route_refuses_what_it_cannot_answer(
    http: TestClient, query: str, status: int
) -> None:
    response = http.get(f"/v1/jobs/99/output{query}", headers=AUTH)
    assert response.status_code == status
    assert "detail" in response.json()


def test_the_client_reads_output_over_http(
    served: str, launcher: Launcher, payload: Payload
) -> None:
    _run(launcher, payload, 45, "#!/bin/bash\nseq 1 5\n")
    with AgentClient(served, TOKEN) as client:
        assert client.output(45)["data"] == "1\n2\n3\n4\n5\n"
        assert client.output(45, offset=2, limit=4)["data"] == "2\n3\n"
        assert client.output(45, stream="stderr")["data"] == ""
        with pytest.raises(NotFound):
            client.output(46)
