"""How spurctld serves the RPC kit (scheduler/rpc/serving.py): uvicorn with each
connection's writes held to the loop's next turn. Answers, whole or streamed, arrive
as sent, in order, over one keep-alive connection."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from scheduler.rpc import server as rpc
from scheduler.rpc import serving
from scheduler.rpc.server import Call, RpcRoute

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def app() -> Any:
    async def echo(call: Call) -> Any:
        return 201, {"got": await call.body()}

    async def stream(request: Request) -> Response:
        async def parts() -> AsyncIterator[bytes]:
            for part in (b"one ", b"two ", b"three"):
                yield part

        return StreamingResponse(parts(), media_type="text/plain")

    served = rpc.rpc_app([RpcRoute("/echo", echo, ("POST",))], token=TOKEN)
    served.router.routes.append(Route("/stream", stream))
    return served


@pytest.fixture
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = serving.server(app(), "127.0.0.1", sock.getsockname()[1])
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(5)
    sock.close()


def test_answers_arrive_whole_and_in_order_on_one_connection(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for n in range(5):
            conn.request("POST", "/echo", json.dumps({"n": n}).encode(), AUTH)
            answer = conn.getresponse()
            assert answer.status == 201
            assert answer.getheader("content-type") == "application/json"
            assert json.loads(answer.read()) == {"got": {"n": n}}
        conn.request("GET", "/stream")
        answer = conn.getresponse()
        assert (answer.status, answer.read()) == (200, b"one two three")
        conn.request("POST", "/echo", b"{}", {})  # no token: refused, the connection kept
        answer = conn.getresponse()
        assert answer.status == 401 and json.loads(answer.read())["code"] == "unauthorized"
    finally:
        conn.close()


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def test_a_turns_writes_leave_as_one_and_a_close_writes_what_is_held() -> None:
    async def turns() -> tuple[list[bytes], list[bytes], bool, str]:
        recorder = Recorder()
        held = serving._HeldWrites(recorder, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(b"head ")
        held.write(b"body")
        assert recorder.writes == []
        await asyncio.sleep(0)
        first = list(recorder.writes)
        assert not held.is_closing()
        held.write(b"last")
        held.close()
        assert held.is_closing()  # the transport's own state
        return first, recorder.writes[1:], recorder.closed, held.get_extra_info("peername")

    first, then, closed, extra = asyncio.run(turns())
    assert first == [b"head body"]
    assert then == [b"last"] and closed
    assert extra == "extra peername"  # the rest is the transport's own
