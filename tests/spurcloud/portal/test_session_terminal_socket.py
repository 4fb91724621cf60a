"""A session's web terminal over `/ws/sessions/<id>/terminal/`
(spurcloud/portal/terminal_consumer.py), through the real ASGI application: turned away
at the handshake as nobody, a billing member, another organisation or a member in
someone else's session; told why when the session does not run or its node is
unreachable; and, with a real controller and a real spurd running the session, a shell
in which `echo hello` says hello, as often as the page reconnects. A token the agent
refuses (forged or expired) closes the browser's socket with the agent's 4401."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from scheduler.rpc import terminal_tokens
from spurcloud.asgi import application
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.services import submit_job
from spurcloud.portal import terminal_consumer
from spurcloud.portal.session_activity import last_session_activity
from spurcloud.portal.sessions import session_templates
from spurcloud.tenants.models import Membership
from tests.agents.spurd import Courier, RunningAgent, reachable_dir, start_agent
from tests.fixtures.processes import Processes, wait_until
from tests.spurcloud.conftest import make_user
from tests.spurcloud.portal.conftest import RUNNERS
from tests.spurcloud.websocket import WebsocketClient

live = pytest.mark.django_db(transaction=True)


def _headers(user: Any | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://localhost")]
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return headers


def _socket(user: Any | None, job_id: int) -> WebsocketClient:
    return WebsocketClient(application, f"/ws/sessions/{job_id}/terminal/", _headers(user))


def _start(people: dict[str, Any], who: str = "member", *, batch: bool = False) -> int:
    member = Membership.objects.get(user=people[who])
    spec: dict[str, Any] = {"script": session_templates()["shell"].script(30), "gpus": 1}
    if not batch:
        spec.update(qos="interactive", comment="spur-session:shell", time_limit_min=30)
    return int(submit_job(organization=member.organization, user=people[who], spec=spec)["job_id"])


def _running(job_id: int) -> int:
    wait_until(
        lambda: controller_client().job(job_id)["state"] == "RUNNING", timeout=30, what="running"
    )
    return job_id


async def _status(socket: WebsocketClient) -> str:
    """The text of the status message the consumer sends before it closes."""
    message = await socket.receive_json_from(timeout=15)
    assert message["type"] == "status", message
    return str(message["text"])


async def _closed(socket: WebsocketClient) -> int:
    output = await socket.receive_output(15)
    assert output["type"] == "websocket.close", output
    return int(output.get("code", 1000))


async def _read_until(socket: WebsocketClient, wanted: bytes, times: int = 1) -> bytes:
    seen = b""
    deadline = time.monotonic() + 30
    while seen.count(wanted) < times:
        output = await socket.receive_output(max(deadline - time.monotonic(), 0.01))
        assert output["type"] == "websocket.send", (output, seen)
        if output.get("bytes") is not None:
            seen += output["bytes"]
    return seen


async def _type(socket: WebsocketClient, data: bytes) -> None:
    await socket.send_input({"type": "websocket.receive", "bytes": data})


# -- refusals (the controller's node has no agent) --------------------------------------------


@live
def test_who_may_not_open_it_is_turned_away_at_the_handshake(
    people: dict[str, Any], live_controller: Any
) -> None:
    theirs = _running(_start(people, "admin"))
    mine = _start(people, "member")
    batch = _start(people, "owner", batch=True)
    lone = make_user("lone")
    cases = [
        (None, mine, 4401),  # nobody signed in
        (lone, mine, 4403),  # in no organisation
        (people["billing"], mine, 4403),  # sees sessions, runs nothing
        (people["member"], theirs, 4403),  # a member, in the admin's session
        (people["outsider"], mine, 4404),  # another organisation's: as if missing
        (people["member"], 999, 4404),  # missing
        (people["member"], batch, 4404),  # a batch job is no session
    ]
    sockets = [(_socket(user, job_id), code) for user, job_id, code in cases]

    async def scenario() -> None:
        for socket, code in sockets:
            assert await socket.connect() == (False, code)

    async_to_sync(scenario)()


@live
def test_a_session_that_does_not_run_says_so(people: dict[str, Any], live_controller: Any) -> None:
    _running(_start(people, "admin"))  # holds the node's only GPU
    pending = _start(people, "member")
    socket = _socket(people["member"], pending)

    async def scenario() -> None:
        assert (await socket.connect())[0]
        assert await _status(socket) == f"Session {pending} is not running."
        assert await _closed(socket) == terminal_consumer.CLOSE_NOT_RUNNING

    async_to_sync(scenario)()


@live
@pytest.mark.parametrize("who", RUNNERS)
def test_an_unreachable_node_is_said_plainly(
    who: str, people: dict[str, Any], live_controller: Any
) -> None:
    job_id = _running(_start(people, "member"))  # on node01, whose agent is the discard port
    socket = _socket(people[who], job_id)

    async def scenario() -> None:
        assert (await socket.connect())[0]
        assert (await _status(socket)).startswith(
            f"Node node01, where session {job_id} runs, is unreachable"
        )
        assert await _closed(socket) == terminal_consumer.CLOSE_NODE_UNREACHABLE

    async_to_sync(scenario)()


def test_the_agents_url_is_its_http_url_as_a_websocket() -> None:
    url = terminal_consumer.agent_terminal_url
    assert url("http://10.0.0.5:6818", 7) == "ws://10.0.0.5:6818/v1/jobs/7/terminal"
    assert url("https://n1.example/agent/", 7) == "wss://n1.example/agent/v1/jobs/7/terminal"
    with pytest.raises(Exception, match="not an http"):
        url("ftp://n1", 7)


# -- through a real agent ---------------------------------------------------------------------


@pytest.fixture
def node(controller: Any, settings: Any, tmp_path: Path) -> Iterator[RunningAgent]:
    """A real spurd (node01, simulated GPUs) registered with the real controller this site
    talks to."""
    settings.SPUR_CONTROLLER_URLS = [controller.url]
    settings.SPUR_CLUSTER_TOKEN = controller.token
    procs = Processes(tmp_path / "agent-logs")
    work_root = reachable_dir()
    try:
        yield start_agent(
            tmp_path,
            procs,
            name="node01",
            token=controller.token,
            controllers=[controller.url],
            work_root=work_root,
        )
    finally:
        procs.stop_all()
        shutil.rmtree(work_root, ignore_errors=True)


@pytest.fixture
def session(
    people: dict[str, Any], controller: Any, node: RunningAgent, tmp_path: Path
) -> Callable[[str], int]:
    """Starts a shell session as `who` on the real node (the courier plays the worker)."""
    courier = Courier(tmp_path / "broker", controller.token)

    def start(who: str) -> int:
        job_id = _start(people, who)
        courier.deliver(job_id)
        return _running(job_id)

    return start


@live
def test_echo_hello_in_the_terminal_says_hello_and_each_reconnection_is_a_new_shell(
    people: dict[str, Any], session: Callable[[str], int]
) -> None:
    job_id = session("member")
    first, second = _socket(people["member"], job_id), _socket(people["member"], job_id)

    async def scenario() -> None:
        assert (await first.connect(timeout=20))[0]
        await first.send_input({"type": "websocket.receive", "text": '{"resize": [120, 40]}'})
        await _type(first, b"echo hello\n")
        await _read_until(first, b"hello", times=2)  # typed, then said
        await _type(first, b"stty size; echo $SLURM_JOB_ID$((1+1))\n")
        seen = await _read_until(first, f"{job_id}2".encode())
        assert b"40 120" in seen
        # A second tab, open at the same time: a shell of its own.
        assert (await second.connect(timeout=20))[0]
        await _type(second, b"echo sec''ond\n")
        await _read_until(second, b"second")
        await first.disconnect()
        await _type(second, b"echo still''here\n")
        await _read_until(second, b"stillhere")
        await second.disconnect()

    async_to_sync(scenario)()
    assert last_session_activity(job_id) is not None  # terminal use is activity


@live
def test_an_owner_opens_a_terminal_in_a_members_session(
    people: dict[str, Any], session: Callable[[str], int]
) -> None:
    job_id = session("member")
    socket = _socket(people["owner"], job_id)

    async def scenario() -> None:
        assert (await socket.connect(timeout=20))[0]
        await _type(socket, b"echo own''er\n")
        await _read_until(socket, b"owner")
        await socket.disconnect()

    async_to_sync(scenario)()


@live
@pytest.mark.parametrize("tamper", ["forged", "expired"])
def test_a_token_the_agent_refuses_closes_the_terminal_with_its_code(
    tamper: str,
    people: dict[str, Any],
    session: Callable[[str], int],
    node: RunningAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a token stolen on the way, or replayed late, meets at the agent."""
    job_id = session("member")
    granted = terminal_consumer.terminal_grant

    def tampered(**kwargs: Any) -> dict[str, Any]:
        grant = dict(granted(**kwargs))
        if tamper == "forged":
            prefix, body, mac = grant["token"].split(".")
            fields = json.loads(terminal_tokens.base64.urlsafe_b64decode(body + "=="))
            fields["user"] = "mallory"
            raw = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
            body = terminal_tokens.base64.urlsafe_b64encode(raw).decode().rstrip("=")
            grant["token"] = f"{prefix}.{body}.{mac}"
        else:
            key = bytes.fromhex((node.spool / "credential").read_text().strip())
            grant["token"] = terminal_tokens.mint(
                key, job_id=job_id, attempt=1, node="node01", tenant="acme", user="max",
                now=time.time() - terminal_tokens.TTL_S - 1,
            )  # fmt: skip
        return grant

    monkeypatch.setattr(terminal_consumer, "terminal_grant", tampered)
    socket = _socket(people["member"], job_id)

    async def scenario() -> None:
        assert (await socket.connect(timeout=20))[0]
        expected = "invalid terminal token" if tamper == "forged" else "terminal token expired"
        assert await _status(socket) == expected
        assert await _closed(socket) == 4401

    async_to_sync(scenario)()


@live
def test_srun_in_the_terminal_runs_a_step_in_the_sessions_allocation(
    people: dict[str, Any], session: Callable[[str], int]
) -> None:
    job_id = session("member")
    socket = _socket(people["member"], job_id)

    async def scenario() -> None:
        assert (await socket.connect(timeout=20))[0]
        await _type(socket, b"srun sh -c 'echo step=$SLURM_STEP_ID on=$SLURMD_NODENAME'\n")
        seen = await _read_until(socket, b"on=node01")
        assert b"step=0 on=node01" in seen, seen
        await socket.disconnect()

    async_to_sync(scenario)()
