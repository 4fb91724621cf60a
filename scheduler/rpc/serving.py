"""How an RPC app is served: uvicorn on uvloop and httptools, with no access log, and
each response written to the socket once, with the GIL released.

uvicorn writes a response's head as soon as the app sends `http.response.start` and its
body as a second write: two `send` calls, two TCP segments on the wire, and the client
woken twice (it reads the head, then waits again for the body). `HttpProtocol` holds a
connection's writes until the event loop's next turn and writes them together: a JSON
answer leaves as one segment. The writes of one connection keep their order, a close
writes what is held first, and a response that streams (its body in several messages,
awaited in between) still goes out as it is sent, a turn later at most.

That one write is also the costliest step of a request: on loopback the kernel delivers
the segment and wakes the client inside the sender's `send` (tens of microseconds on the
controller's machines, most of the HTTP thread's time), and uvloop's `transport.write`
makes that call holding the GIL, so the Raft thread that every commit waits on stands
still meanwhile. When the transport has nothing queued of its own, `_HeldWrites` writes
to the socket with `os.write`, which releases the GIL around the call; what the socket
does not take at once (or an error) goes to the transport's own `write`, which queues it
behind nothing and handles it as it always does. A TLS transport's socket is never
written to directly (its bytes must be encrypted): it keeps the transport's write.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeldWrites:
    """A transport whose writes are held until the loop's next turn, then written as
    one, straight to the socket where it can be (module docstring); everything else is
    the transport's own."""

    __slots__ = ("_fd", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        self._fd = _plain_socket_fd(transport)

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = [data]
            self._loop.call_soon(self.flush)
        else:
            self._held.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        held = self._held
        if held is None:
            return
        self._held = None
        transport = self._transport
        if transport.is_closing():  # the client left: nobody to write to
            return
        data = held[0] if len(held) == 1 else b"".join(held)
        # The socket directly only while the transport holds nothing that must go first;
        # the fd is the transport's own while it is not closing.
        if self._fd >= 0 and not transport.get_write_buffer_size():
            try:
                sent = os.write(self._fd, data)
            except (BlockingIOError, InterruptedError):  # full: the transport waits for room
                sent = 0
            except OSError:  # the connection broke: the transport's write meets it and closes
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        transport.write(data)

    def is_closing(self) -> bool:
        # Asked a few times a request (uvicorn's receive, send and completion): a method
        # of its own, not a `__getattr__` that first fails the slot lookup.
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _plain_socket_fd(transport: asyncio.Transport) -> int:
    """The fd of a plain (not TLS) stream socket under `transport`, or -1."""
    if transport.get_extra_info("sslcontext") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    fileno = getattr(sock, "fileno", None)
    if fileno is None or getattr(sock, "type", None) != socket.SOCK_STREAM:
        return -1
    fd = fileno()
    return fd if isinstance(fd, int) else -1


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing each response once (module docstring)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeldWrites(transport, self.loop))  # type: ignore[arg-type]


def server(app: Any, host: str, port: int, **options: Any) -> uvicorn.Server:
    """A uvicorn server for an RPC app: uvloop, httptools (`HttpProtocol`), no access log,
    no forwarded-for headers (the clients are the cluster's own, not proxies)."""
    settings: dict[str, Any] = {
        "loop": "uvloop",
        "http": HttpProtocol,
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": False,
        **options,
    }
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, **settings))
