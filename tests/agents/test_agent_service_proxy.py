"""The agent's proxy to a session's web service (agents/service_proxy.py): the real app
and launcher, a real sandboxed job serving HTTP and a websocket echo on its Unix socket
(tests/fixtures/session_service.py, standing in for JupyterLab)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from agents.api import create_app
from agents.credentials import NodeCredential
from agents.launcher import Launcher, LaunchRequest
from agents.service_proxy import socket_name
from scheduler.rpc import terminal_tokens
from tests.agents.conftest import OTHER_TENANT, TENANT, make_payload
from tests.fixtures.processes import wait_until
from tests.fixtures.session_service import SERVICE

KEY = bytes(range(32))
JOB = 7
PREFIX = f"/v1/jobs/{JOB}/service/sessions/{JOB}/jupyter"

SCRIPT = f"""#!/bin/sh
python3 - --sock "$PWD/{socket_name("$SLURM_JOB_ID")}" <<'PY' &
{SERVICE}
PY
echo ready
exec sleep 120
"""


@pytest.fixture
def credential(tmp_path: Path) -> NodeCredential:
    held = NodeCredential(tmp_path / "credential", "sim01")
    held.store(KEY.hex())
    return held


@pytest.fixture
def http(launcher: Launcher, credential: NodeCredential) -> Iterator[TestClient]:
    with TestClient(create_app(launcher=launcher, token="cluster", credential=credential)) as c:
        yield c


def _start(launcher: Launcher, job_id: int = JOB, tenant: str = TENANT) -> Path:
    launcher.launch(LaunchRequest.from_payload(make_payload(job_id, SCRIPT, tenant=tenant)))
    sock = launcher.workspaces.root / tenant / "jobs" / str(job_id) / socket_name(job_id)
    try:
        wait_until(sock.exists, timeout=30, what="the session's service socket")
    except TimeoutError:
        out = sock.parent / f"slurm-{job_id}.out"
        raise AssertionError(out.read_text() if out.exists() else "no output") from None
    return sock


@pytest.fixture
def session(launcher: Launcher) -> Path:
    return _start(launcher)


def token(
    *,
    job_id: int = JOB,
    tenant: str = TENANT,
    key: bytes = KEY,
    now: float | None = None,
    **kw: Any,
) -> dict[str, str]:
    minted = terminal_tokens.mint(
        key,
        job_id=job_id,
        attempt=1,
        node="sim01",
        tenant=tenant,
        user="alice",
        now=time.time() if now is None else now,
        kind=kw.get("kind", terminal_tokens.SERVICE),
    )
    return {"X-Spur-Service-Token": minted}


def test_a_get_reaches_the_service_with_its_path_query_and_host(
    http: TestClient, session: Path
) -> None:
    answer = http.get(
        f"{PREFIX}/api/contents/my%20notes.ipynb?type=notebook&content=1",
        headers={**token(), "X-Forwarded-Host": "portal.example:8443", "Accept": "text/x"},
    )
    assert answer.status_code == 200, answer.text
    said = answer.json()
    assert said["method"] == "GET"
    assert said["path"] == f"/sessions/{JOB}/jupyter/api/contents/my notes.ipynb"
    assert said["query"] == "type=notebook&content=1"
    assert said["headers"]["host"] == "portal.example:8443"
    assert said["headers"]["accept"] == "text/x"
    assert "x-spur-service-token" not in said["headers"]


def test_a_post_carries_its_body_and_loses_hop_by_hop_headers(
    http: TestClient, session: Path
) -> None:
    answer = http.post(
        f"{PREFIX}/api/sessions",
        content=b'{"kernel": {"name": "python3"}}',
        headers={
            **token(),
            "Content-Type": "application/json",
            "Connection": "keep-alive, X-Private",
            "X-Private": "for this hop only",
            "Proxy-Authorization": "Basic secret",
            "X-XSRFToken": "abc",
        },
    )
    said = answer.json()
    assert said["method"] == "POST"
    assert json.loads(said["body"]) == {"kernel": {"name": "python3"}}
    assert said["headers"]["x-xsrftoken"] == "abc"
    assert said["headers"]["content-length"] == str(len(said["body"]))
    for gone in ("x-private", "proxy-authorization", "connection"):
        assert gone not in said["headers"]


def test_the_answer_streams_back_whole_without_hop_by_hop_headers(
    http: TestClient, session: Path
) -> None:
    big = http.get(f"{PREFIX}/files/big", headers=token())
    assert big.status_code == 200 and big.content == b"x" * (1024 * 1024)
    cookies = http.get(f"{PREFIX}/cookies", headers=token())
    assert "keep-alive" not in cookies.headers
    # The agent passes every cookie on: the web decides which reach the browser.
    assert len(cookies.headers.get_list("set-cookie")) == 2


def test_a_websocket_echoes_through_the_proxy_with_its_subprotocol(
    http: TestClient, session: Path
) -> None:
    path = f"{PREFIX}/api/kernels/k1/channels?session_id=s1"
    with http.websocket_connect(
        path, headers=token(), subprotocols=["v1.kernel.websocket.jupyter.org"]
    ) as ws:
        assert ws.accepted_subprotocol == "v1.kernel.websocket.jupyter.org"
        hello = json.loads(ws.receive_text())
        assert hello["path"] == f"/sessions/{JOB}/jupyter/api/kernels/k1/channels?session_id=s1"
        ws.send_text("hello")
        assert ws.receive_text() == "echo:hello"
        ws.send_bytes(b"\x00\x01binary")
        assert ws.receive_bytes() == b"\x00\x01binary"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Spur-Service-Token": "nonsense"},
        token(key=bytes(32)),  # forged: not this node's credential
        token(now=time.time() - 3600),  # expired
        token(kind=terminal_tokens.PREFIX),  # a terminal token is no service token
        token(job_id=8),  # for a job that does not run here
        token(tenant=OTHER_TENANT),  # for another organisation
    ],
    ids=["none", "garbage", "forged", "expired", "terminal", "other-job", "other-tenant"],
)
def test_it_refuses_what_lacks_a_good_token_for_this_job(
    http: TestClient, session: Path, headers: dict[str, str]
) -> None:
    assert http.get(f"{PREFIX}/lab", headers=headers).status_code == 401
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        http.websocket_connect(f"{PREFIX}/api/events/subscribe", headers=headers),
    ):
        pass
    assert refused.value.code == 4401


def test_a_token_for_one_job_does_not_open_another(
    http: TestClient, launcher: Launcher, session: Path
) -> None:
    _start(launcher, job_id=9)
    answer = http.get("/v1/jobs/9/service/sessions/9/jupyter/lab", headers=token(job_id=JOB))
    assert answer.status_code == 401
    assert http.get("/v1/jobs/9/service/x", headers=token(job_id=9)).status_code == 200


@pytest.mark.parametrize(
    "path", ["%2e%2e/launch", "a/%2E/b", "a/%2e%2E", "a\\b", "a%00b", "a%0d%0ab"]
)
def test_it_refuses_dot_segments_and_odd_characters(
    http: TestClient, session: Path, path: str
) -> None:
    answer = http.get(f"/v1/jobs/{JOB}/service/{path}", headers=token())
    # A line break does not even match the route (404); the rest are refused by name.
    assert answer.status_code == (404 if "%0a" in path else 400)


def test_it_refuses_a_job_that_has_not_started_its_service(
    http: TestClient, launcher: Launcher
) -> None:
    payload = make_payload(JOB, "#!/bin/sh\necho ready\nexec sleep 60\n")
    launcher.launch(LaunchRequest.from_payload(payload))
    wait_until(lambda: launcher.run_record(JOB, 1) is not None, timeout=30, what="start")
    answer = http.get(f"{PREFIX}/lab", headers=token())
    assert answer.status_code == 502
    assert "does not answer" in answer.text


def test_it_talks_only_to_a_listener_of_the_jobs_own_identity(
    http: TestClient, session: Path, tmp_path: Path
) -> None:
    """The tenant owns the run directory: a symlink planted in place of the socket, to a
    socket of someone else (here the agent's own user), gets nothing sent to it."""
    other = Path(f"/tmp/spur-proxy-{os.getpid()}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.unlink(missing_ok=True)
    listener.bind(str(other))
    listener.listen(4)
    received: list[bytes] = []

    def accept() -> None:
        conn, _ = listener.accept()
        conn.settimeout(2)
        try:
            received.append(conn.recv(100))
        except OSError:
            received.append(b"")
        conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        session.unlink()
        session.symlink_to(other)
        if os.geteuid() == session.parent.stat().st_uid:
            pytest.skip("the job runs as the agent's own user (personal mode)")
        answer = http.get(f"{PREFIX}/lab", headers=token())
        assert answer.status_code == 502
        assert "not the job's" in answer.text
        thread.join(5)
        assert received == [b""]  # connected, checked, closed: not a byte sent
    finally:
        listener.close()
        other.unlink(missing_ok=True)
