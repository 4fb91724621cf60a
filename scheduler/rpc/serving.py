"""How an RPC app is served: uvicorn on uvloop and httptools, with no access log, and
each response written to the socket once.

uvicorn writes a response's head as soon as the app sends `http.response.start` and its
body as a second write: two `send` calls, two TCP segments on the wire, and the client
woken twice (it reads the head, then waits again for the body). `HttpProtocol` holds a
connection's writes until the event loop's next turn and writes them together: a JSON
answer leaves as one segment. The writes of one connection keep their order, a close
writes what is held first, and a response that streams (its body in several messages,
awaited in between) still goes out as it is sent, a turn later at most.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeldWrites:
    """A transport whose writes are held until the loop's next turn, then written as
    one; everything else is the transport's own."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

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
        if held is not None:
            self._held = None
            if not self._transport.is_closing():  # the client left: nobody to write to
                self._transport.write(held[0] if len(held) == 1 else b"".join(held))

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
