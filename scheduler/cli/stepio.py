"""srun's side of a running step: its tasks' output from each node, their input, their
terminal, and its signals (docs/architecture.md, "Job steps").

Inside a job srun talks to each node's agent itself (`Direct`); outside (salloc's
command, srun on a login host) to the web API, which carries every request to the
agents (`ViaWeb`): tenants never learn agent URLs. Either way, per node of the step:

- **Output.** A stream of JSON lines (agents/step_run.py). srun counts, per task, the
  bytes of stdout and stderr it received; when a stream breaks before every task there
  has ended (the agent restarted, the web restarted, the network dropped), srun attaches
  again with those counts and the node goes on where it stopped: no line is lost or
  printed twice. It keeps trying for RECONNECT_S.
- **Input.** srun's stdin (or the `-i` file) goes to the tasks that read it, a piece of
  at most MAX_STEP_INPUT_CHUNK bytes per request, each request answered once its tasks
  have taken it: srun reads no more than they do (back-pressure). Each piece says where
  in the input it starts; the agent refuses one that does not start where the input has
  reached and says where that is, so a piece resent after a lost answer is never
  written twice. Its end is sent as a last piece.
- **Terminal** (`--pty`). srun's terminal is put in raw mode (output processing off
  too: the task's terminal has turned its newlines into CR LF already, as Slurm 22.05's
  srun leaves it) and restored when srun ends, before srun says how the step ended;
  every keystroke is input, and a changed window size (SIGWINCH) is sent on.
- **Signals.** SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to srun are
  sent on to the tasks (srun(1): "Signals sent to the srun command are automatically
  forwarded to the tasks"); a third makes srun give up waiting.

Nothing here imports more than the standard library: this runs inside every job's
sandbox, where no platform package is installed.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import select
import signal as signals
import struct
import sys
import termios
import threading
import time
import tty
import urllib.error
import urllib.request
from typing import Any

from scheduler.core.contract.steps import MAX_STEP_INPUT_CHUNK

RECONNECT_S = 120.0  # how long srun tries to reach a node again before it gives up
TIMEOUT_S = 30.0
# A stream is never quiet longer than its agent's keep-alive (agents/step_run.py): one
# quiet for this long is taken for lost, and attached again.
STREAM_TIMEOUT_S = 90.0
FORWARDED = (
    signals.SIGINT,
    signals.SIGTERM,
    signals.SIGHUP,
    signals.SIGQUIT,
    signals.SIGUSR1,
    signals.SIGUSR2,
)
_GIVE_UP_AFTER = 3  # forwarded signals: the third makes srun stop waiting


class Retry(Exception):
    """A request that did not get through, for a passing reason (no answer, 5xx)."""


class Fatal(Exception):
    """A refusal: trying again changes nothing."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class Moved(Fatal):
    """A piece of input that does not start where the tasks' input has reached."""

    def __init__(self, written: int) -> None:
        super().__init__(f"the input has reached {written} bytes")
        self.written = written


def post(url: str, body: dict[str, Any], token: str | None, *, timeout: float = TIMEOUT_S) -> Any:
    """POST JSON; the open response. Raises Retry or Fatal (with the server's words)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (our URLs)
    except urllib.error.HTTPError as exc:
        answer = _answer(exc)
        detail = str(answer.get("detail") or exc.reason)
        if exc.code >= 500 or exc.code in (408, 429):
            raise Retry(detail) from None
        if exc.code == 409 and answer.get("code") == "offset":
            raise Moved(int(answer.get("written", 0))) from None
        raise Fatal(detail, str(answer.get("code") or "")) from None
    except (OSError, ValueError) as exc:  # URLError, a reset, a timeout, a torn answer
        raise Retry(str(getattr(exc, "reason", exc))) from None


def _answer(exc: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        found = json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def call(url: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
    with post(url, body, token) as response:
        try:
            found = json.loads(response.read() or b"{}")
        except (OSError, ValueError) as exc:
            raise Retry(str(exc)) from None
    return found if isinstance(found, dict) else {}


class Link:
    """One node of the step, as srun follows it."""

    def __init__(self, node: str, ranks: list[int], io: str) -> None:
        self.node = node
        self.ranks = ranks
        self.io = io
        self.lock = threading.Lock()
        self.offsets = {rank: [0, 0] for rank in ranks}
        self.exits: dict[int, tuple[int, int]] = {}
        self.failed: str | None = None
        self.started = threading.Event()  # its tasks run: its agent has answered the launch

    def account(self, event: dict[str, Any]) -> None:
        """Count what an event brings (before it is printed: a reconnection asks for
        what follows it)."""
        rank = event.get("t")
        if not isinstance(rank, int) or rank not in self.offsets:
            return
        with self.lock:
            for index, key in enumerate(("o", "e")):
                if key in event:
                    data = base64.b64decode(event[key])
                    event[key] = data
                    self.offsets[rank][index] += len(data)
            if "lost" in event:
                self.offsets[rank][0 if event.get("k") == "o" else 1] += int(event["lost"])
            if "x" in event:
                self.exits[rank] = (int(event["x"]), int(event.get("s") or 0))

    def done(self) -> bool:
        with self.lock:
            return self.failed is not None or len(self.exits) == len(self.ranks)

    def position(self) -> list[list[int]]:
        """[[rank, stdout bytes, stderr bytes]] received: where an attachment resumes."""
        with self.lock:
            return [[rank, *pair] for rank, pair in self.offsets.items()]


class Transport:
    """How srun reaches the agents of one step (inside the job, or through the web)."""

    def __init__(self, job_id: str, step_id: int) -> None:
        self.job_id, self.step_id = job_id, step_id

    def attach(self, link: Link) -> Any:
        raise NotImplementedError

    def send_input(self, link: Link, offset: int, data: bytes, eof: bool) -> dict[str, Any]:
        raise NotImplementedError

    def resize(self, link: Link, cols: int, rows: int) -> None:
        raise NotImplementedError

    def signal(self, link: Link, signum: int) -> None:
        raise NotImplementedError

    def record_end(self, exit_code: int, signum: int) -> None:
        """How the step ended, when whoever usually records it could not see it whole."""


class Direct(Transport):
    """Inside the job: each node's agent, with the step's I/O credential for it."""

    def __init__(self, job_id: str, step_id: int, agents: dict[str, str]) -> None:
        super().__init__(job_id, step_id)
        self.agents = agents

    def _url(self, link: Link, what: str) -> str:
        base = self.agents[link.node].rstrip("/")
        return f"{base}/v1/jobs/{self.job_id}/steps/{self.step_id}/{what}"

    def attach(self, link: Link) -> Any:
        body = {"offsets": link.position()}
        return post(self._url(link, "attach"), body, link.io, timeout=STREAM_TIMEOUT_S)

    def send_input(self, link: Link, offset: int, data: bytes, eof: bool) -> dict[str, Any]:
        body = {"offset": offset, "data": base64.b64encode(data).decode(), "eof": eof}
        return call(self._url(link, "input"), body, link.io)

    def resize(self, link: Link, cols: int, rows: int) -> None:
        call(self._url(link, "resize"), {"cols": cols, "rows": rows}, link.io)

    def signal(self, link: Link, signum: int) -> None:
        call(self._url(link, "signal"), {"signal": signum}, link.io)


class ViaWeb(Transport):
    """Outside the job: the web API, which carries each request to the node's agent."""

    def __init__(self, job_id: str, step_id: int, api_url: str, token: str) -> None:
        super().__init__(job_id, step_id)
        self.base = f"{api_url.rstrip('/')}/api/v1/jobs/{job_id}/steps/{step_id}"
        self.token = token

    def attach(self, link: Link) -> Any:
        body = {"node": link.node, "io": link.io, "offsets": link.position()}
        return post(f"{self.base}/attach", body, self.token, timeout=STREAM_TIMEOUT_S)

    def send_input(self, link: Link, offset: int, data: bytes, eof: bool) -> dict[str, Any]:
        body = {"node": link.node, "io": link.io, "offset": offset,
                "data": base64.b64encode(data).decode(), "eof": eof}  # fmt: skip
        return call(f"{self.base}/input", body, self.token)

    def resize(self, link: Link, cols: int, rows: int) -> None:
        body = {"node": link.node, "io": link.io, "cols": cols, "rows": rows}
        call(f"{self.base}/resize", body, self.token)

    def signal(self, link: Link, signum: int) -> None:
        call(f"{self.base}/signal", {"node": link.node, "io": link.io, "signal": signum},
             self.token)  # fmt: skip

    def record_end(self, exit_code: int, signum: int) -> None:
        """The web records a step's end from its own stream; one that broke (srun
        attached again) leaves it to srun."""
        call(f"{self.base}/end", {"exit_code": exit_code, "signal": signum}, self.token)


Event = tuple[str, dict[str, Any]] | None


class Step:
    """A started step: its nodes, and the events of their streams as they come."""

    def __init__(self, job_id: str, step_id: int, links: list[Link], transport: Transport,
                 *, record_end: bool, verbose: bool = False) -> None:  # fmt: skip
        self.job_id, self.step_id = job_id, step_id
        self.links = links
        self.by_node = {link.node: link for link in links}
        self.transport = transport
        self.record_end = record_end  # srun tells the controller how it ended (inside)
        self.verbose = verbose
        self.events: queue.Queue[Event] = queue.Queue(maxsize=256)
        self.reattached = False  # a stream broke: srun followed a node on its own since
        self._lock = threading.Lock()
        self._live = 0

    @property
    def rank_node(self) -> dict[int, str]:
        return {rank: link.node for link in self.links for rank in link.ranks}

    def spawn(self, target: Any, *args: Any) -> None:
        """A reader of the step's events (each ends by putting None)."""
        with self._lock:
            self._live += 1
        threading.Thread(target=target, args=args, daemon=True).start()

    def ended_reader(self) -> bool:
        """One reader is over; True when none is left."""
        with self._lock:
            self._live -= 1
            return self._live == 0

    def read(self, response: Any, default: Link | None, lost: Any = None) -> set[str]:
        """Put every event of a stream (a web stream names each event's node; an agent's
        is `default`'s); the nodes it heard from. `lost(link)`: the web lost that node's
        stream (it goes on for the others)."""
        heard: set[str] = set()
        try:
            for raw in response:
                event = json.loads(raw)
                node = event.pop("node", None)
                link = self.by_node.get(str(node)) if node is not None else default
                if link is None:
                    continue
                if "lost" in event and "t" not in event:
                    self._say(f"{link.node}: {event['lost']}")
                    if lost is not None:
                        lost(link)
                    if link is default:
                        break
                    continue
                heard.add(link.node)
                link.started.set()  # its agent streams: its tasks run
                if not event:  # a stream's first line, or a keep-alive
                    continue
                if "error" in event:
                    with link.lock:
                        link.failed = str(event["error"])
                link.account(event)
                self.events.put((link.node, event))
        except (OSError, ValueError) as exc:
            self._say(f"the stream broke: {exc}")
        finally:
            response.close()
        return heard

    def follow(self, link: Link, opener: Any = None) -> None:
        """Read one node's stream until all its tasks have ended: the launch's answer
        (`opener`), then as many attachments as it takes; for RECONNECT_S at most while
        nothing is heard from it."""
        deadline: float | None = None
        delay = 0.2
        try:
            while not link.done():
                try:
                    if opener is None:
                        self.reattached = True
                        response = self.transport.attach(link)
                    else:
                        response = opener()
                    opener = None
                    link.started.set()
                    if link.node in self.read(response, link):
                        deadline, delay = None, 0.2
                    if not link.done():
                        raise Retry("its stream ended before its tasks")
                except Fatal as exc:
                    if exc.code == "step_launched":  # launched, its answer lost: attach
                        opener = None
                        continue
                    self._fail(link, str(exc))
                except Retry as exc:
                    now = time.monotonic()
                    deadline = deadline or now + RECONNECT_S
                    if now > deadline:
                        self._fail(link, f"lost the connection to {link.node}: {exc}")
                        break
                    self._say(f"{link.node}: {exc}: reconnecting")
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            link.started.set()  # failed for good: nobody waits for it any more
            self.events.put(None)

    def follow_web(self, response: Any) -> None:
        """The web's stream of the whole step; a node it loses, or leaves unfinished,
        is followed on its own."""
        followed: set[str] = set()

        def on_its_own(link: Link) -> None:
            if link.node not in followed:
                followed.add(link.node)
                self.spawn(self.follow, link)

        try:
            self.read(response, None, lost=on_its_own)
            for link in self.links:
                if not link.done():
                    on_its_own(link)
        finally:
            self.events.put(None)

    def _fail(self, link: Link, message: str) -> None:
        with link.lock:
            link.failed = message
        self.events.put((link.node, {"error": message}))

    def _say(self, message: str) -> None:
        if self.verbose:
            print(f"srun: {message}", file=sys.stderr)


# -- srun's input ------------------------------------------------------------------------


def pump_input(step: Step, source: int, targets: list[Link], *, close: bool) -> None:
    """Send srun's input (`source`, a descriptor) to the nodes of the tasks that read it,
    one piece at a time, each once the last was taken; its end last."""
    positions = {link.node: 0 for link in targets}
    for link in targets:  # input goes to tasks that run: not before the launch's answer
        link.started.wait()
    try:
        while True:
            data = read_piece(source)
            for link in targets:
                if not link.done():
                    positions[link.node] = _send_all(step, link, positions[link.node], data)
            if not data or all(link.done() for link in targets):
                return
    finally:
        if close:
            os.close(source)


GATHER_S = 0.005  # how long a piece waits for more of a producer that streams


def read_piece(fd: int) -> bytes:
    """What is there to read now, up to a piece's size (b"" at the end). A keystroke, or
    a short read, goes at once; a producer that streams (it filled what a read takes) is
    gathered into full pieces: one request a piece, whatever the pipe's size."""
    try:
        data = os.read(fd, MAX_STEP_INPUT_CHUNK)
    except OSError:
        return b""
    wait = GATHER_S if len(data) >= _PIPE_READ else 0.0
    while data and len(data) < MAX_STEP_INPUT_CHUNK:
        try:
            ready, _, _ = select.select([fd], [], [], wait)
        except (OSError, ValueError):
            break
        if not ready:
            break
        more = os.read(fd, MAX_STEP_INPUT_CHUNK - len(data))
        if not more:
            break
        data += more
    return data


_PIPE_READ = 4096  # a read this large is a producer that streams, not a person typing


def _send_all(step: Step, link: Link, offset: int, data: bytes) -> int:
    """Send `data` from `offset` (the input's end when it is empty) until the node's
    tasks have taken it all; where their input has reached then."""
    start, end, eof = offset, offset + len(data), not data
    deadline: float | None = None
    while True:
        try:
            answer = step.transport.send_input(link, offset, data[offset - start :], eof)
            written, deadline = int(answer.get("written", offset)), None
            if written >= end and (not eof or answer.get("eof")):
                return end
        except Moved as moved:
            written = moved.written
            if written < start:  # it lost input it had taken: nothing to resend it from
                step._fail(link, f"its input went back to {written} bytes")
                return end
            if written > end:
                return end
        except Fatal as exc:
            # The step left the node, or no task there reads its input any more.
            step._say(f"{link.node}: input: {exc}")
            return end
        except Retry as exc:
            now = time.monotonic()
            deadline = deadline or now + RECONNECT_S
            if now > deadline or link.done():
                step._say(f"{link.node}: input: {exc}")
                return end
            time.sleep(0.2)
            continue
        offset = max(written, offset) if written <= end else end


# -- a terminal (--pty) ------------------------------------------------------------------


def window_size(fd: int) -> tuple[int, int] | None:
    """(columns, rows) of the terminal on `fd`, as Slurm reads it (its stdout)."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return None
    return cols, rows


class RawTerminal:
    """srun's terminal in raw mode while the step runs, as it was after."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.saved: list[Any] | None = None

    def __enter__(self) -> RawTerminal:
        if os.isatty(self.fd):
            self.saved = termios.tcgetattr(self.fd)
            tty.setraw(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSAFLUSH, self.saved)
            self.saved = None


class WindowFollower:
    """Each new window size of srun's terminal (SIGWINCH), sent to the task's."""

    def __init__(self, step: Step, link: Link, fd: int) -> None:
        self.step, self.link, self.fd = step, link, fd
        self.changed = threading.Event()
        self.previous: Any = None

    def __enter__(self) -> WindowFollower:
        self.previous = signals.signal(signals.SIGWINCH, lambda *_: self.changed.set())
        threading.Thread(target=self._send, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        signals.signal(signals.SIGWINCH, self.previous)

    def _send(self) -> None:
        last = window_size(self.fd)
        while not self.link.done():
            if not self.changed.wait(1.0):
                continue
            self.changed.clear()
            size = window_size(self.fd)
            if size is None or size == last:
                continue
            last = size
            try:
                self.step.transport.resize(self.link, *size)
            except (Retry, Fatal) as exc:
                self.step._say(f"{self.link.node}: resize: {exc}")


# -- signals ----------------------------------------------------------------------------


class Forwarder:
    """Signals srun receives, sent on to the step's tasks."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.count = 0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> Forwarder:
        for signum in FORWARDED:
            # One srun was started with ignoring (`srun ... &` in a script: SIGINT and
            # SIGQUIT) it goes on ignoring, as Slurm's does.
            if signals.getsignal(signum) is not signals.SIG_IGN:
                self.previous[signum] = signals.signal(signum, self._received)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signals.signal(signum, handler)

    def _received(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count >= _GIVE_UP_AFTER:
            raise KeyboardInterrupt
        threading.Thread(target=self._send, args=(signum,), daemon=True).start()

    def _send(self, signum: int) -> None:
        for link in self.step.links:
            if not link.done():
                try:
                    self.step.transport.signal(link, signum)
                except (Retry, Fatal) as exc:
                    self.step._say(f"{link.node}: signal {signum}: {exc}")


__all__ = [
    "Direct",
    "Fatal",
    "Forwarder",
    "Link",
    "RawTerminal",
    "Retry",
    "Step",
    "ViaWeb",
    "WindowFollower",
    "call",
    "post",
    "pump_input",
    "window_size",
]
