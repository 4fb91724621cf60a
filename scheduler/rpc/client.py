"""The client half: one HTTP client for every internal caller and for the CLI.

`RpcClient(urls, token)` knows every replica of a service and moves on to the next when
one cannot be reached or has no leader (503); it remembers the one that answered. With
`retry_for_s`, it keeps trying (exponential backoff, through tenacity) while every
replica is unavailable, e.g. during an election; only do that for calls that are safe
to repeat, which every call of the controller and the agent is (submissions carry an
idempotency key, reports are idempotent by (job, attempt)). An answer's status becomes
the same error the server raised (`scheduler.rpc.errors`).

The wire is the kit's own HTTP/1.1 (`scheduler.rpc.http`, the CLI's too) over connections
kept alive between calls (`Connections`), not httpx nor `http.client`: a call through
httpx's layers (client, transport, connection pool, h11's state machine, a log line each)
cost the web and the worker about three times the CPU of the call itself, and
`http.client` (an `HTTPResponse` over a `makefile` each answer, its headers read by the
`email` parser) about twice what the kit's wire costs (bench/rpc_transport.py); the web,
the worker and the agents make one or more calls a job. A kept connection that the server
closed meanwhile is found when the request fails before any answer came, and that request
alone is sent once more on a new connection; whatever fails on a new connection is the
replica's `Unavailable`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlencode, urlsplit

import orjson

from scheduler.rpc.errors import UNREACHABLE, RpcError, Unavailable, error_for
from scheduler.rpc.http import Connection, ProtocolError, RemoteDisconnected

IDLE_PER_ORIGIN = 32  # kept connections a client holds per replica (its callers' threads)


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer as the client reads it: its status, its body, where it came from."""

    status_code: int
    content: bytes
    url: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


# How a client sends one request: (method, absolute URL, body, headers, timeout or None
# for the client's) -> its answer. OSError and `ProtocolError` say the server was not
# reached, went away, or did not answer in HTTP.
Send = Callable[[str, str, bytes | None, Mapping[str, str], float | None], Answer]

# A kept connection the server closed while it sat idle fails with one of these before
# any answer arrives: the request never reached the server, so it is sent again.
_STALE = (RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class Connections:
    """Connections (`scheduler.rpc.http`) kept alive per origin (scheme, host, port) and
    shared by the threads of one client: a call takes an idle connection (or opens one),
    and puts it back once it read the whole answer, unless the server closes it."""

    def __init__(self, *, timeout: float, idle_max: int = IDLE_PER_ORIGIN) -> None:
        self.timeout = timeout
        self.idle_max = idle_max
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._lock = threading.Lock()

    def __call__(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float | None = None,
    ) -> Answer:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ProtocolError(f"not an http(s) URL: {url!r}")
        origin = (scheme, parts.hostname, parts.port or (443 if scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._take(origin)
        if conn is not None:
            try:
                return self._exchange(origin, conn, method, target, body, headers, url, timeout)
            except _STALE:
                pass  # closed while idle: once more, on a new connection
        conn = Connection(scheme, origin[1], origin[2], timeout=self.timeout)
        return self._exchange(origin, conn, method, target, body, headers, url, timeout)

    def _exchange(
        self,
        origin: tuple[str, str, int],
        conn: Connection,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        url: str,
        timeout: float | None,
    ) -> Answer:
        status, content = conn.request(method, target, headers, body, timeout)
        if conn.connected:  # the connection closes itself on an error and on the server's word
            self._put(origin, conn)
        return Answer(status, content, url)

    def _take(self, origin: tuple[str, str, int]) -> Connection | None:
        with self._lock:
            idle = self._idle.get(origin)
            return idle.pop() if idle else None

    def _put(self, origin: tuple[str, str, int], conn: Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.idle_max:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


class RpcClient:
    def __init__(
        self,
        urls: Sequence[str] | str,
        token: str,
        *,
        timeout: float = 10.0,
        retry_for_s: float = 0.0,
        transport: Send | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("no URL configured")
        self.urls = [u.strip().rstrip("/") for u in urls]
        self.retry_for_s = retry_for_s
        self._preferred = 0
        self._lock = threading.Lock()
        self._headers = {"Authorization": f"Bearer {token}", **(headers or {})}
        self._connections = Connections(timeout=timeout)
        self._send_one: Send = transport if transport is not None else self._connections

    def close(self) -> None:
        self._connections.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of `path` (relative to a replica's URL, or absolute). Takes
        `json` (a body), `params` (a query: a mapping or (name, value) pairs) and
        `headers` (more headers) and `timeout` (seconds, this call's, each replica)."""
        return self._call(answer, method, path, **kwargs)

    def call_bytes(self, method: str, path: str, **kwargs: Any) -> bytes:
        """The same call, its answer's body as it came: for a caller that passes the JSON
        on without reading it (the web's list answers). Errors are as `call` raises them."""
        body: bytes = self._call(answer_bytes, method, path, **kwargs)
        return body

    def _call(self, read: Callable[[Answer], Any], method: str, path: str, **kwargs: Any) -> Any:
        request = self._request(path, **kwargs)
        if self.retry_for_s <= 0:
            return self._once(read, method, *request)
        # The first attempt without tenacity: it almost always answers, and a Retrying
        # made and run for each call was a third of what a call cost the web (a job's
        # submission). When it is unavailable, tenacity goes on as if it had made it:
        # that failure is its first attempt's, and its window still starts before it.
        start = time.monotonic()
        try:
            return self._once(read, method, *request)
        except Unavailable as exc:
            first: list[Unavailable] = [exc]
        import tenacity  # only callers that retry pay for the import (the CLI does not)

        def attempt(*args: Any) -> Any:
            if first:
                raise first.pop()
            return self._once(*args)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Unavailable),
            stop=tenacity.stop_after_delay(self.retry_for_s - (time.monotonic() - start)),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            reraise=True,
        )
        return retrying(attempt, read, method, *request)

    def _request(
        self,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[str, bytes | None, dict[str, str], float | None]:
        """The path with its query, the body, the headers and the timeout of a call."""
        if params:
            path += ("&" if "?" in path else "?") + urlencode(params, doseq=True)
        sent = {**self._headers, **(headers or {})}
        body = None
        if json is not None:
            body = orjson.dumps(json, option=orjson.OPT_NON_STR_KEYS)
            sent["Content-Type"] = "application/json"
        return path, body, sent, timeout

    def _once(
        self,
        read: Callable[[Answer], Any],
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float | None,
    ) -> Any:
        request = (body, headers, timeout)
        if path.startswith(("http://", "https://")):
            return read(self._send(method, path, *request))
        with self._lock:
            start = self._preferred
        last: Unavailable | None = None
        for step in range(len(self.urls)):
            index = (start + step) % len(self.urls)
            try:
                response = self._send(method, self.urls[index] + path, *request)
            except Unavailable as exc:
                last = last if last is not None and last.code != UNREACHABLE else exc
                continue
            if response.status_code == 503:  # a replica without a leader: try another
                try:
                    answer(response)
                except Unavailable as exc:
                    last = exc
                continue
            with self._lock:
                self._preferred = index
            return read(response)
        assert last is not None
        raise last

    def _send(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float | None,
    ) -> Answer:
        try:
            return self._send_one(method, url, body, headers, timeout)
        except (OSError, ProtocolError) as exc:
            raise Unavailable(f"{url}: {exc or type(exc).__name__}", code=UNREACHABLE) from exc


def message_of(response: Answer) -> str:
    try:
        body = orjson.loads(response.content)
    except ValueError:
        return response.text.strip()[:200] or f"HTTP {response.status_code}"
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return f"HTTP {response.status_code}"


def answer(response: Answer) -> Any:
    """The JSON of a successful answer; the error the server raised otherwise."""
    if response.status_code < 400:
        try:
            return orjson.loads(response.content)
        except ValueError:
            raise Unavailable(f"{response.url}: the answer is not JSON") from None
    raise_error(response)


def answer_bytes(response: Answer) -> bytes:
    """The body of a successful answer as it came; the error the server raised otherwise."""
    if response.status_code < 400:
        return response.content
    raise_error(response)


def raise_error(response: Answer) -> NoReturn:
    """The error an answer of 400 or more stands for, raised."""
    code = ""
    try:
        body = orjson.loads(response.content)
        if isinstance(body, dict):
            code = str(body.get("code", ""))
    except ValueError:
        pass
    raise error_for(response.status_code, message_of(response), code)


__all__ = [
    "UNREACHABLE",
    "Answer",
    "Connections",
    "RpcClient",
    "RpcError",
    "Send",
    "answer",
    "answer_bytes",
    "message_of",
]
