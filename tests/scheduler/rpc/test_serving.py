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


# -- the direct write (the GIL released): order, a full socket, TLS, a broken connection --


async def _connected(
    loop: asyncio.AbstractEventLoop,
) -> tuple[asyncio.Transport, socket.socket]:
    """A uvloop transport to a plain socket that the test reads (or does not)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    transport, _ = await loop.create_connection(asyncio.Protocol, *listener.getsockname())
    peer, _ = listener.accept()
    listener.close()
    return transport, peer


def _on_uvloop(test: Any) -> Any:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(test())


def _read_all(peer: socket.socket, size: int) -> bytes:
    peer.settimeout(10)
    got = bytearray()
    while len(got) < size:
        chunk = peer.recv(1 << 20)
        assert chunk, "the connection closed early"
        got += chunk
    return bytes(got)


def test_a_plain_sockets_writes_go_straight_to_it_in_order() -> None:
    async def written() -> tuple[int, bytes, int]:
        transport, peer = await _connected(asyncio.get_running_loop())
        held = serving._HeldWrites(transport, asyncio.get_running_loop())
        fd = held._fd
        for n in range(3):
            held.write(b"head %d " % n)
            held.write(b"body %d;" % n)
            await asyncio.sleep(0)
        queued = transport.get_write_buffer_size()
        got = _read_all(peer, 3 * len(b"head 0 body 0;"))
        transport.close()
        peer.close()
        return fd, got, queued

    fd, got, queued = _on_uvloop(written)
    assert fd >= 0 and queued == 0  # written by `os.write`, nothing left to the transport
    assert got == b"head 0 body 0;head 1 body 1;head 2 body 2;"


def test_what_a_full_socket_does_not_take_is_queued_and_later_writes_follow_it() -> None:
    big = bytes(range(256)) * (16 * 1024)  # 4 MiB: more than the socket's buffers take

    async def written() -> tuple[int, int, bytes]:
        transport, peer = await _connected(asyncio.get_running_loop())
        held = serving._HeldWrites(transport, asyncio.get_running_loop())
        held.write(big)
        held.flush()
        after_big = transport.get_write_buffer_size()  # the rest, queued by the transport
        # The client reads some while the loop stands still: the socket has room again,
        # but the transport's rest must still go before anything written after it.
        first = _read_all(peer, 1 << 20)
        time.sleep(0.05)
        held.write(b"after")
        held.flush()
        after_small = transport.get_write_buffer_size()
        reading = asyncio.get_running_loop().run_in_executor(
            None, _read_all, peer, len(big) + len(b"after") - len(first)
        )
        got = first + await reading
        transport.close()
        peer.close()
        return after_big, after_small, got

    after_big, after_small, got = _on_uvloop(written)
    assert 0 < after_big < len(big)
    assert after_small == after_big + len(b"after")  # behind the rest, not on the socket
    assert got == big + b"after"


def test_a_tls_transports_socket_is_never_written_directly() -> None:
    class Tls(Recorder):
        def __init__(self, sock: socket.socket) -> None:
            super().__init__()
            self.sock = sock

        def get_extra_info(self, name: str) -> Any:
            return {"sslcontext": object(), "socket": self.sock}.get(name)

        def get_write_buffer_size(self) -> int:
            return 0

    async def written() -> tuple[int, list[bytes]]:
        a, b = socket.socketpair()
        try:
            tls = Tls(a)
            held = serving._HeldWrites(tls, asyncio.get_running_loop())  # type: ignore[arg-type]
            held.write(b"ciphertext only")
            await asyncio.sleep(0)
            return held._fd, tls.writes
        finally:
            a.close()
            b.close()

    fd, writes = asyncio.run(written())
    assert fd == -1 and writes == [b"ciphertext only"]  # through the transport's write


def test_a_broken_connection_is_left_to_the_transport() -> None:
    async def written() -> tuple[bool, list[BaseException]]:
        loop = asyncio.get_running_loop()
        errors: list[BaseException] = []
        loop.set_exception_handler(lambda _, context: errors.append(context.get("exception")))
        transport, peer = await _connected(loop)
        held = serving._HeldWrites(transport, loop)
        # The peer resets the connection: a write to it fails (EPIPE or ECONNRESET).
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        peer.close()
        await asyncio.sleep(0.05)
        for _ in range(3):
            held.write(b"x" * 1000)
            held.flush()  # raises nothing: the transport meets the error and closes
            await asyncio.sleep(0.01)
        return transport.is_closing(), errors

    closing, errors = _on_uvloop(written)
    assert closing
    assert all(isinstance(e, OSError | type(None)) for e in errors)
