"""The agent's proxy to a session's web service (its JupyterLab): HTTP and websockets.

    browser ─► web (portal user, spurcloud/portal/jupyter_proxy.py)
            ─► agent  /v1/jobs/{id}/service/{path}   X-Spur-Service-Token: spur-svc....
            ─► Unix socket {run_dir}/.spur-session-{id}.sock, served inside the job's sandbox

A session's service listens on no network port: the job's sandbox shares the host's
network, where every other job of the node could reach a TCP port. It listens on a Unix
socket in the job's run directory (the session's script names it in
`SPUR_SESSION_SOCKET`, spurcloud/portal/sessions.py), which only the organisation's
identity can reach. The agent forwards to it what carries a service token the controller
minted for this job (scheduler/rpc/terminal_tokens.py, of the kind `spur-svc`: a
terminal token is refused here), for the job's attempt and organisation, unexpired.

The run directory belongs to the tenant, who can put a symlink where the socket should
be, towards another organisation's socket or the agent's own. So the agent checks who
listens before it sends a byte: the peer's uid (SO_PEERCRED) must be the job's identity.

The path after `/service` is forwarded as it is (the service is told its base URL);
a `.` or `..` segment, a backslash or a control character is refused (400). The token
header and hop-by-hop headers are not forwarded; a request body is read whole up to
MAX_BODY (413 past it); the response streams back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpcore
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from scheduler.rpc import terminal_tokens
from scheduler.rpc.errors import Unauthorized

if TYPE_CHECKING:  # the web imports this module for its names, not the agent's machinery
    from agents.credentials import NodeCredential
    from agents.launcher import Launcher

log = logging.getLogger(__name__)

PATH = "/v1/jobs/{job_id}/service/{path:path}"
TOKEN_HEADER = "x-spur-service-token"
# The host the browser asked for (the portal's): the service's Host, so that its origin
# check of websockets (JupyterLab's) sees the browser's Origin on the same host.
FORWARDED_HOST = "x-forwarded-host"
_HOST = re.compile(r"^(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?\Z")
MAX_BODY = 32 * 1024 * 1024  # JupyterLab uploads big files in 1 MiB chunks
MAX_MESSAGE = 16 * 1024 * 1024  # a websocket message (a notebook output with images)
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Websocket handshake headers the websocket client makes itself.
_HANDSHAKE = frozenset(
    {"host", "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"}
    | {"sec-websocket-protocol", "sec-websocket-accept", "content-length"}
)
_UNIX_PATH_MAX = 107  # sun_path, less its terminating NUL


def socket_name(job_id: int | str) -> str:
    """The socket of job `job_id`'s service, in its run directory."""
    return f".spur-session-{job_id}.sock"


class ServiceUnavailable(Exception):
    """The job's service does not answer (not started yet, ended, or not its own)."""


def service_host(forwarded: str) -> str:
    """The Host the service sees: the portal's, when it looks like a host name."""
    return forwarded if _HOST.match(forwarded) else "localhost"


def safe_path(path: str) -> str | None:
    """`path` quoted for the request line, or None when a segment is `.` or `..` or it
    holds a backslash or a control character."""
    if any(ord(c) < 0x20 or c in "\\\x7f" for c in path):
        return None
    if any(segment in (".", "..") for segment in path.split("/")):
        return None
    return quote(path, safe="/:@!$&'()*+,;=-._~")


def forwarded_headers(
    headers: Iterable[tuple[str, str]], *, drop: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """The headers a proxy passes on: none that is hop-by-hop, named by Connection, or in
    `drop` (compared in lower case)."""
    pairs = [(k.lower(), v) for k, v in headers]
    named = {
        token.strip().lower()
        for key, value in pairs
        if key == "connection"
        for token in value.split(",")
    }
    dropped = HOP_BY_HOP | named | {d.lower() for d in drop}
    return [(k, v) for k, v in pairs if k not in dropped]


def _peer_uid(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[1])


def _check_peer(sock: socket.socket, uid: int) -> None:
    found = _peer_uid(sock)
    if found != uid:
        raise ServiceUnavailable(f"the socket's listener is uid {found}, not the job's {uid}")


class _CheckedUnixBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, refusing a socket whose listener is not the job's uid."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a session's service is reached on its Unix socket only")

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        stream = await self.inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        try:
            _check_peer(stream.get_extra_info("socket"), self.uid)
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class ServiceProxy:
    def __init__(self, launcher: Launcher, credential: NodeCredential | None) -> None:
        self.launcher = launcher
        self.credential = credential

    def routes(self) -> list[BaseRoute]:
        return [
            Route(PATH, self.http, methods=METHODS),
            WebSocketRoute(PATH, self.websocket),
        ]

    # -- who may, and where ------------------------------------------------------------

    def _batch_jobs(self) -> dict[int, tuple[int, str]]:
        """job id -> (attempt, tenant) of the jobs whose batch script runs here."""
        found: dict[int, tuple[int, str]] = {}
        for job in self.launcher.running():
            if job["pid"] is None:
                continue  # only steps of it run here
            request = self.launcher.job_request(job["job_id"], job["attempt"])
            if request is not None and request.first_node == self.launcher.node:
                found[request.job_id] = (request.attempt, request.spec.tenant)
        return found

    def _target(self, job_id: str, token: str) -> tuple[str, int, int]:
        """(socket path, the job's uid, job id) when the token opens this job's service."""
        key = self.credential.key if self.credential is not None else None
        if key is None:
            raise Unauthorized("this node takes no service tokens yet")
        jobs = self._batch_jobs()
        fields = terminal_tokens.check(
            key,
            token,
            node=self.launcher.node,
            jobs=jobs,
            now=time.time(),
            kind=terminal_tokens.SERVICE,
        )
        if str(fields["job_id"]) != job_id:
            raise Unauthorized("this service token is for another job")
        job = int(fields["job_id"])
        record = self.launcher.run_record(job, jobs[job][0])
        if record is None:
            raise ServiceUnavailable(f"job {job} has not started")
        path = f"{record['run_dir'].rstrip('/')}/{socket_name(job)}"
        if len(path.encode()) > _UNIX_PATH_MAX:
            raise ServiceUnavailable(f"the socket path of job {job} is too long")
        return path, int(record["uid"]), job

    # -- HTTP --------------------------------------------------------------------------

    async def http(self, request: Request) -> Response:
        try:
            sock, uid, job = self._target(
                str(request.path_params["job_id"]), request.headers.get(TOKEN_HEADER, "")
            )
        except Unauthorized as exc:
            return _text(401, exc.message)
        except ServiceUnavailable as exc:
            return _text(502, str(exc))
        target = safe_path(str(request.path_params["path"]))
        if target is None:
            return _text(400, "invalid path")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return _text(413, f"the request body is over {MAX_BODY} bytes")
        headers = forwarded_headers(
            request.headers.items(), drop=(TOKEN_HEADER, "content-length", "host", FORWARDED_HOST)
        )
        headers.append(("host", service_host(request.headers.get(FORWARDED_HOST, ""))))
        query = request.url.query
        url = f"http://localhost/{target}" + (f"?{query}" if query else "")
        pool = httpcore.AsyncConnectionPool(uds=sock, network_backend=_CheckedUnixBackend(uid))
        stream = pool.stream(request.method, url, headers=headers, content=bytes(body))
        try:
            response = await stream.__aenter__()
        except (OSError, httpcore.NetworkError, ServiceUnavailable) as exc:
            await pool.aclose()
            log.info("job %s: its service does not answer: %s", job, exc)
            return _text(502, f"the session's service does not answer: {exc}")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_stream():
                    yield chunk
            finally:
                with contextlib.suppress(Exception):
                    await stream.__aexit__(None, None, None)
                await pool.aclose()

        returned = forwarded_headers(
            ((k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers)
        )
        return StreamingResponse(relay(), status_code=response.status, headers=_multi(returned))

    # -- websockets --------------------------------------------------------------------

    async def websocket(self, websocket: WebSocket) -> None:
        try:
            sock_path, uid, job = self._target(
                str(websocket.path_params["job_id"]), websocket.headers.get(TOKEN_HEADER, "")
            )
        except Unauthorized:
            await websocket.close(code=4401)
            return
        except ServiceUnavailable:
            await websocket.close(code=1011)
            return
        target = safe_path(str(websocket.path_params["path"]))
        if target is None:
            await websocket.close(code=4400)
            return
        query = websocket.url.query
        headers = forwarded_headers(
            websocket.headers.items(), drop=(TOKEN_HEADER, FORWARDED_HOST, *_HANDSHAKE)
        )
        host = service_host(websocket.headers.get(FORWARDED_HOST, ""))
        uri = f"ws://{host}/{target}" + (f"?{query}" if query else "")
        try:
            upstream = await open_unix_websocket(
                sock_path,
                uid,
                uri,
                headers=headers,
                subprotocols=_subprotocols(websocket.headers.get("sec-websocket-protocol", "")),
            )
        except (OSError, InvalidHandshake, ServiceUnavailable, TimeoutError) as exc:
            log.info("job %s: its service refused a websocket: %s", job, exc)
            await websocket.close(code=1011)  # before the handshake: the web sees a 403
            return
        await websocket.accept(subprotocol=upstream.subprotocol)
        await relay_websocket(websocket, upstream)


async def open_unix_websocket(
    path: str,
    uid: int,
    uri: str,
    *,
    headers: list[tuple[str, str]],
    subprotocols: list[str],
) -> ClientConnection:
    """A websocket to the service on its Unix socket, once its listener is the job's uid."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, path)
        _check_peer(sock, uid)
        return await connect(
            uri,
            sock=sock,
            additional_headers=headers,
            subprotocols=subprotocols or None,  # type: ignore[arg-type]
            max_size=MAX_MESSAGE,
            compression=None,
            proxy=None,
            open_timeout=10,
        )
    except BaseException:
        sock.close()
        raise


async def relay_websocket(websocket: WebSocket, upstream: ClientConnection) -> None:
    """Both ways until either side closes; the other is closed with its code."""

    async def down() -> None:
        try:
            async for message in upstream:
                if isinstance(message, bytes):
                    await websocket.send_bytes(message)
                else:
                    await websocket.send_text(message)
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with contextlib.suppress(Exception):
            await websocket.close(code=code if code != 1005 else 1000)

    task = asyncio.create_task(down())
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])
    except (WebSocketDisconnect, ConnectionClosed, RuntimeError):
        pass
    finally:
        await upstream.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _subprotocols(header: str) -> list[str]:
    return [p.strip() for p in header.split(",") if p.strip()]


def _multi(pairs: list[tuple[str, str]]) -> MutableHeaders:
    """Starlette takes a mapping of headers; several Set-Cookie lines need its raw list."""
    headers = MutableHeaders()
    for key, value in pairs:
        headers.append(key, value)
    return headers


def _text(status: int, message: str) -> Response:
    return Response(message + "\n", status_code=status, media_type="text/plain")


__all__ = [
    "MAX_BODY",
    "PATH",
    "TOKEN_HEADER",
    "ServiceProxy",
    "forwarded_headers",
    "safe_path",
    "socket_name",
]
