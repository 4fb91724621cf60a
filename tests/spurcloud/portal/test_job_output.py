"""A job's output in the portal: the download links, and the live tail over
`/ws/jobs/<id>/output/`, both read from the job's agent through the API's own selector.
The agent is the small real HTTP server of tests/spurcloud/test_job_output.py,
registered with a real controller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient, Client

from spurcloud.asgi import application
from spurcloud.portal import output_consumer
from spurcloud.portal.output_consumer import JobOutputConsumer
from tests.fixtures.processes import free_port
from tests.spurcloud.conftest import Tenant, make_user
from tests.spurcloud.portal.conftest import ROLES, record
from tests.spurcloud.test_job_output import FakeAgent, _register
from tests.spurcloud.websocket import WebsocketClient

OUT = "epoch 1 loss 0.9\nepoch 2 loss 0.5\n"
ERR = "warning: slow\n"


def _job(job_id: int = 41, *, nodes: list[str] | None = None, **changes: Any) -> None:
    nodes = ["node02"] if nodes is None else nodes
    state, reason = ("RUNNING", "None") if nodes else ("PENDING", "Priority")
    record(job_id, state=state, reason=reason, nodes=nodes, attempt=1, **changes)


# -- download ------------------------------------------------------------------------------


def _download(user: Any, path: str) -> tuple[Any, bytes]:
    """As the ASGI server serves it: the response's chunks, read as they come."""
    client = AsyncClient()
    client.force_login(user)

    async def fetch() -> tuple[Any, bytes]:
        response = await client.get(path)
        if not response.streaming:
            return response, response.content
        return response, b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(fetch)()


@pytest.mark.parametrize("who", ROLES)
def test_members_download_each_stream_whole(
    who: str, people: dict[str, Any], agent: FakeAgent, settings: Any
) -> None:
    settings.API_OUTPUT_MAX_BYTES = 7  # several chunks
    agent.outputs[41] = {"stdout": OUT, "stderr": ERR}
    _job()
    response, body = _download(people[who], "/jobs/41/stdout")
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="job-41.out"'
    assert body.decode() == OUT
    assert len(agent.requests) == (len(OUT) + 6) // 7  # a chunk at a time
    stderr, body = _download(people[who], "/jobs/41/stderr")
    assert body.decode() == ERR
    assert stderr["Content-Disposition"] == 'attachment; filename="job-41.err"'


def test_an_outsider_downloads_nothing(people: dict[str, Any], agent: FakeAgent) -> None:
    agent.outputs[41] = {"stdout": OUT, "stderr": ERR}
    _job()
    assert _download(people["outsider"], "/jobs/41/stdout")[0].status_code == 404
    assert agent.requests == []


def test_an_unreachable_node_is_said_plainly(people: dict[str, Any], live_controller: Any) -> None:
    _register(live_controller, "node03", f"http://127.0.0.1:{free_port()}")
    _job(nodes=["node03"])
    response, body = _download(people["member"], "/jobs/41/stdout")
    assert response.status_code == 503
    assert b"Node node03, where job 41 ran, is unreachable" in body


# -- the live tail ---------------------------------------------------------------------------

live = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(JobOutputConsumer, "poll_interval_s", 0.05)


def _headers(user: Any | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://localhost")]
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return headers


def _socket(user: Any | None, job_id: int = 41) -> WebsocketClient:
    return WebsocketClient(application, f"/ws/jobs/{job_id}/output/", headers=_headers(user))


def _finish(fake: FakeAgent) -> None:
    """From now on the agent says the job is over."""
    answer = fake.answer

    def finished(path: str, headers: Any) -> tuple[int, dict[str, Any]]:
        status, body = answer(path, headers)
        if status == 200:
            body["running"] = False
        return status, body

    fake.answer = finished  # type: ignore[method-assign]


@live
@pytest.mark.parametrize("who", ROLES)
def test_a_member_follows_the_output_until_the_job_ends(
    who: str, people: dict[str, Any], agent: FakeAgent, quick: None
) -> None:
    agent.outputs[41] = {"stdout": OUT, "stderr": ERR}
    _job()
    socket = _socket(people[who])

    async def scenario() -> None:
        connected, _ = await socket.connect()
        assert connected
        assert await socket.receive_json_from() == {
            "type": "state", "state": "RUNNING", "kind": "running", "reason": "", "exit": ""
        }  # fmt: skip
        first = await socket.receive_json_from()
        assert first == {"type": "output", "stream": "stdout", "offset": 0, "data": OUT}
        assert (await socket.receive_json_from())["data"] == ERR
        agent.outputs[41]["stdout"] = OUT + "epoch 3 loss 0.2\n"
        more = await socket.receive_json_from()
        assert more == {
            "type": "output",
            "stream": "stdout",
            "offset": len(OUT),
            "data": "epoch 3 loss 0.2\n",
        }
        _finish(agent)
        await asyncio.sleep(0.2)  # the agent says it is over, the history not yet: no end
        await sync_to_async(record)(
            41, state="COMPLETED", nodes=["node02"], exit_code=0, signal=0, reason="None"
        )
        assert await socket.receive_json_from() == {
            "type": "state", "state": "COMPLETED", "kind": "succeeded", "reason": "", "exit": "0:0"
        }  # fmt: skip
        assert await socket.receive_json_from() == {"type": "end", "state": "COMPLETED"}
        await socket.disconnect()

    async_to_sync(scenario)()


@live
def test_a_long_output_starts_at_its_tail(
    people: dict[str, Any], agent: FakeAgent, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output_consumer, "TAIL_BYTES", 10)
    agent.outputs[41] = {"stdout": OUT, "stderr": ""}
    _job()
    socket = _socket(people["member"])

    async def scenario() -> None:
        assert (await socket.connect())[0]
        assert (await socket.receive_json_from())["type"] == "state"
        first = await socket.receive_json_from()
        skipped = len(OUT) - 10
        assert first == {
            "type": "output",
            "stream": "stdout",
            "offset": skipped,
            "skipped": skipped,
            "data": OUT[skipped:],
        }
        await socket.disconnect()

    async_to_sync(scenario)()


@live
def test_a_job_that_has_not_started_says_so_and_ends_if_it_never_runs(
    acme: Tenant, agent: FakeAgent, quick: None
) -> None:
    _job(nodes=[])
    socket = _socket(acme.member)

    async def scenario() -> None:
        assert (await socket.connect())[0]
        assert (await socket.receive_json_from())["state"] == "PENDING"
        status = await socket.receive_json_from()
        assert status["type"] == "status"
        assert status["text"] == "Job 41 has not started: there is no output yet."
        await sync_to_async(record)(41, state="CANCELLED", nodes=[])
        cancelled = await socket.receive_json_from()
        assert (cancelled["type"], cancelled["kind"]) == ("state", "stopped")
        assert await socket.receive_json_from() == {"type": "end", "state": "CANCELLED"}
        await socket.disconnect()

    async_to_sync(scenario)()


@live
def test_who_may_not_read_it_is_turned_away_at_the_handshake(
    people: dict[str, Any], agent: FakeAgent, quick: None
) -> None:
    agent.outputs[41] = {"stdout": OUT, "stderr": ERR}
    _job()
    lone = make_user("lone")
    cases = [
        (None, 41, 4401),  # nobody signed in
        (lone, 41, 4403),  # in no organisation
        (people["outsider"], 41, 4404),  # another organisation's job: as if missing
        (people["member"], 999, 4404),  # missing
    ]

    sockets = [(_socket(user, job_id), code) for user, job_id, code in cases]

    async def scenario() -> None:
        for socket, code in sockets:
            assert await socket.connect() == (False, code)

    async_to_sync(scenario)()
    assert agent.requests == []
