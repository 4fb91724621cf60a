"""The web terminal's far end: a websocket on the agent that is a shell in a job running here.

    browser ─ws─▶ web (spurcloud/portal/terminal_consumer.py) ─ws─▶ spurd
                                 /v1/jobs/{id}/terminal, Authorization: Bearer spur-term...
                                                 │
                                   PTY master ◀──┘ ──▶ slave: setsid --ctty bash -i, as the
                                                       job's identity, in a sandbox of its
                                                       own like a step's (agents/steps.py)

The websocket carries no cluster token: the browser's way here is a terminal token the
controller minted for this node's credential (scheduler/rpc/terminal_tokens.py), checked
against the jobs whose batch script runs here (their attempt and organisation) before
anything else happens. A refusal accepts and closes at once with a code, so the web can
tell the browser why: 4401 bad, expired or foreign token (or this job does not run
here), 4429 too many terminals in the job, 4503 the node cannot open one now.

Frames: binary both ways are the terminal's bytes (keystrokes in, output out); a text
frame from the web is a JSON control message, `{"resize": [cols, rows]}` (TIOCSWINSZ,
and so SIGWINCH to the shell's foreground). Each frame in is at most MAX_FRAME bytes;
a larger one closes the socket (1009).

The Slurm commands in the shell (agents/slurm_cli.py) use the web API as the person at
the keyboard: the web passes a short-lived API token of theirs for this connection in
`X-Spur-Api-Token` and its URL as nodes reach it in `X-Spur-Api-Url`; both are checked
for their form (a malformed one is refused, 4400, before any shell starts) and put in the
shell's environment only (`SPUR_TOKEN`, `SPUR_API_URL`, and `SPUR_USER`, the user the
terminal token names, for `squeue --me`), never in the job's.

The shell is a step of the job's to the agent (`StepRunner.start_shell`): its task
directory is fenced with the node's lease, a cancel or the job's end kills it, and its
environment is the job's (SLURM_JOB_ID, the step client and its credential: srun runs
steps in the allocation), the terminal's additions over it. It is
`bash -i`, not a login shell: a login shell's /etc/profile resets PATH and would hide
the step client. When the socket closes, the sandbox (so the shell's whole process
group and everything it started) is killed; when the shell exits, the socket closes
with 1000.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from agents.credentials import NodeCredential
from agents.launch_request import InvalidLaunch, LaunchError
from agents.step_io import SETSID, set_size
from agents.steps import StepRefused, StepRun
from scheduler.rpc import terminal_tokens
from scheduler.rpc.errors import Unauthorized

if TYPE_CHECKING:
    from agents.launcher import Launcher

log = logging.getLogger(__name__)

PATH = "/v1/jobs/{job_id}/terminal"
MAX_FRAME = 64 * 1024  # keystrokes and pastes; a larger paste is sent in pieces
MAX_TERMINALS_PER_JOB = 4  # a few browser tabs; each is a sandbox and a shell
READ_CHUNK = 64 * 1024
MAX_SIZE = 1000  # columns or rows: no screen has more
CLOSE_ENDED = 1000
CLOSE_BAD_HEADER = 4400
CLOSE_TOO_BIG = 1009
CLOSE_UNAUTHORIZED = 4401
CLOSE_TOO_MANY = 4429
CLOSE_UNAVAILABLE = 4503
TERM = "xterm-256color"  # what xterm.js is
API_TOKEN_HEADER = "x-spur-api-token"
API_URL_HEADER = "x-spur-api-url"
# An API token's form (spurcloud/tenants/tokens.py: `spur_` and URL-safe base64), with
# room to grow; tests/agents/test_agent_terminal.py checks that a minted one fits.
API_TOKEN_FORM = re.compile(r"spur_[A-Za-z0-9_-]{20,200}")
MAX_API_URL = 512


class BadHeader(ValueError):
    """A header from the web that is not what it must be."""


def api_environment(headers: Mapping[str, str], user: str) -> dict[str, str]:
    """The shell's `SPUR_TOKEN`, `SPUR_API_URL` and `SPUR_USER` from the web's headers
    (none without a token)."""
    token = headers.get(API_TOKEN_HEADER)
    url = headers.get(API_URL_HEADER)
    if token is None:
        if url is not None:
            raise BadHeader("X-Spur-Api-Url without X-Spur-Api-Token")
        return {}
    if not API_TOKEN_FORM.fullmatch(token):
        raise BadHeader("X-Spur-Api-Token is not an API token")
    env = {"SPUR_TOKEN": token, "SPUR_USER": user}
    if url is not None:
        fine = len(url) <= MAX_API_URL and url.isascii() and url.isprintable()
        parts = urlsplit(url) if fine else None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or "@" in parts.netloc
            or " " in url
            or parts.query
            or parts.fragment
        ):
            raise BadHeader(f"X-Spur-Api-Url is not an http(s) URL of at most {MAX_API_URL} bytes")
        env["SPUR_API_URL"] = url.rstrip("/")
    return env


def shell_argv() -> list[str]:
    """The terminal's shell: its own session with the PTY as its controlling terminal, so
    that ^C and window size changes reach its foreground job (bubblewrap's --new-session
    left it none); `--wait`, so the sandbox lives as long as the shell."""
    bash = shutil.which("bash") or "/bin/sh"
    return [SETSID, "--ctty", "--wait", bash, "-i"]


def parse_control(text: str) -> tuple[int, int] | None:
    """`(cols, rows)` of a resize message; None for anything else (ignored)."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    size = message.get("resize") if isinstance(message, dict) else None
    if (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE for v in size)
    ):
        return int(size[0]), int(size[1])
    return None


class Terminals:
    """The terminals open on this node, counted per job."""

    def __init__(self, launcher: Launcher, credential: NodeCredential | None) -> None:
        self.launcher = launcher
        self.credential = credential
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}

    def running_jobs(self) -> Mapping[int, tuple[int, str]]:
        """Job id -> (attempt, organisation) of the jobs whose batch script runs here."""
        found: dict[int, tuple[int, str]] = {}
        for job in self.launcher.running():
            request = self.launcher.job_request(int(job["job_id"]), int(job["attempt"]))
            if request is not None and request.first_node == self.launcher.node:
                found[request.job_id] = (request.attempt, request.spec.tenant)
        return found

    def check(self, job_id: int, header: str) -> dict[str, Any]:
        key = self.credential.key if self.credential is not None else None
        if key is None:
            raise Unauthorized(f"node {self.launcher.node} takes no terminals now")
        token = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
        fields = terminal_tokens.check(
            key, token, node=self.launcher.node, jobs=self.running_jobs(), now=time.time()
        )
        if fields["job_id"] != job_id:
            raise Unauthorized("this terminal token is for another job")
        return fields

    def claim(self, job_id: int) -> bool:
        with self._lock:
            if self._open.get(job_id, 0) >= MAX_TERMINALS_PER_JOB:
                return False
            self._open[job_id] = self._open.get(job_id, 0) + 1
            return True

    def release(self, job_id: int) -> None:
        with self._lock:
            left = self._open.get(job_id, 0) - 1
            if left > 0:
                self._open[job_id] = left
            else:
                self._open.pop(job_id, None)

    async def serve(self, websocket: WebSocket) -> None:
        raw = str(websocket.path_params["job_id"])
        await websocket.accept()
        if not raw.isdigit() or len(raw) > 18:
            await websocket.close(CLOSE_UNAUTHORIZED, "invalid job id")
            return
        job_id = int(raw)
        try:
            fields = self.check(job_id, websocket.headers.get("authorization", ""))
        except Unauthorized as exc:
            log.warning("terminal for job %s refused: %s", job_id, exc.message)
            await websocket.close(CLOSE_UNAUTHORIZED, exc.message)
            return
        try:
            extra = api_environment(websocket.headers, str(fields["user"]))
        except BadHeader as exc:
            log.warning("terminal for job %s refused: %s", job_id, exc)
            await websocket.close(CLOSE_BAD_HEADER, str(exc))
            return
        if not self.claim(job_id):
            await websocket.close(
                CLOSE_TOO_MANY, f"at most {MAX_TERMINALS_PER_JOB} terminals in a job"
            )
            return
        try:
            await self._relay(websocket, job_id, int(fields["attempt"]), str(fields["user"]), extra)
        finally:
            self.release(job_id)

    async def _relay(
        self, websocket: WebSocket, job_id: int, attempt: int, user: str, extra: dict[str, str]
    ) -> None:
        master, slave = os.openpty()
        run: StepRun | None = None
        try:
            set_size(master, 80, 24)
            env = {"TERM": TERM, "COLORTERM": "truecolor", **extra}
            try:
                run = await run_in_threadpool(
                    self.launcher.steps.start_shell,
                    job_id,
                    attempt,
                    argv=shell_argv(),
                    env=env,
                    tty=slave,
                )
            except (StepRefused, InvalidLaunch, LaunchError, OSError) as exc:
                log.warning("terminal for job %s could not start: %s", job_id, exc)
                await websocket.close(CLOSE_UNAVAILABLE, str(exc)[:120])
                return
            finally:
                os.close(slave)
            log.info("terminal opened in job %s.%s for %s", job_id, attempt, user)
            await _pump(websocket, master)
        finally:
            if run is not None:
                await run_in_threadpool(self.launcher.steps.end, run)
                log.info("terminal closed in job %s.%s for %s", job_id, attempt, user)
            os.close(master)


async def _pump(websocket: WebSocket, master: int) -> None:
    """Relays until either side ends: the shell (EIO on the master) or the socket."""
    loop = asyncio.get_running_loop()
    os.set_blocking(master, False)
    output: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)

    paused = False

    def readable() -> None:
        nonlocal paused
        try:
            chunk = os.read(master, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: every slave side is closed, the shell is gone
            chunk = b""
        output.put_nowait(chunk)
        if not chunk or output.full():
            # The end; or a slow socket: stop reading (the shell blocks on its writes)
            # until the queue is drained.
            loop.remove_reader(master)
            paused = bool(chunk)

    async def to_socket() -> None:
        nonlocal paused
        loop.add_reader(master, readable)
        try:
            while True:
                chunk = await output.get()
                if not chunk:
                    return
                await websocket.send_bytes(chunk)
                if paused and output.empty():
                    paused = False
                    loop.add_reader(master, readable)
        finally:
            loop.remove_reader(master)

    async def from_socket() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data: bytes | None = message.get("bytes")
            text: str | None = message.get("text")
            if len(data or b"") > MAX_FRAME or len(text or "") > MAX_FRAME:
                await websocket.close(CLOSE_TOO_BIG, f"a frame holds at most {MAX_FRAME} bytes")
                return
            if data:
                await _write_all(master, data)
            elif text is not None:
                size = parse_control(text)
                if size is not None:
                    set_size(master, *size)

    shell = asyncio.create_task(to_socket())
    socket = asyncio.create_task(from_socket())
    try:
        done, _ = await asyncio.wait({shell, socket}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (shell, socket):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
                await task
    if shell in done:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close(CLOSE_ENDED, "the shell exited")


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await asyncio.sleep(0.01)  # the shell reads slower than the user types
            continue
        view = view[written:]


def route(launcher: Launcher, credential: NodeCredential | None) -> WebSocketRoute:
    """The route agents/api.py mounts (outside the cluster token: the terminal token)."""
    return WebSocketRoute(PATH, Terminals(launcher, credential).serve)


__all__ = [
    "API_TOKEN_HEADER",
    "API_URL_HEADER",
    "MAX_FRAME",
    "MAX_TERMINALS_PER_JOB",
    "PATH",
    "SETSID",
    "Terminals",
    "route",
]
