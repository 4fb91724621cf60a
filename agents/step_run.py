"""One step's tasks on this node, with their streams: what srun (or the web for it)
attaches to, writes its input into, resizes and signals (agents/steps.py starts them).

A pump thread per step copies each task's output FIFO (or its terminal's master side)
into the task's journal (agents/step_io.py), at most BACKLOG bytes ahead of where the
attached stream has reached, notes when a task's sandbox has ended (its init's pidfd),
and, once everything it wrote has been read, takes its status from its supervisor. A
stream (`stream`, an async generator in the API's event loop) sends the journals from
the offsets its client names, then each task's end:

    {"t": rank, "o": base64}          a piece of the task's stdout
    {"t": rank, "e": base64}          a piece of its stderr
    {"t": rank, "lost": n, "k": "o"}  n bytes of that stream were dropped before it
                                      was read again (see RETAIN)
    {"t": rank, "x": exit, "s": sig}  the task ended
    {}                                first, and after KEEP_ALIVE_S of nothing else

One stream is attached at a time: a new one (srun reconnecting) replaces the old. A
step nobody is attached to is `detached_since` then: the runner kills it after a grace
period (srun is gone for good), as Slurm ends a step whose srun died.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import logging
import os
import selectors
import signal as signals
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.jobtask import JobTask
from agents.step_io import (
    BACKLOG,
    CHUNK,
    RETAIN,
    Journal,
    Lost,
    open_input,
    read_input_at,
    release,
    set_size,
    write_input_at,
)
from scheduler.core.contract.steps import MAX_STEP_TASKS
from scheduler.rpc.errors import Conflict, Refused

log = logging.getLogger(__name__)

INPUT_WAIT_S = 10.0  # how long one piece of input waits for its task to read: then a part
KEEP_ALIVE_S = 30.0  # a quiet stream says `{}` this often: srun takes a silent one for lost
VEOF = b"\x04"  # a terminal's end of input (^D), what `script` sends when its input ends


class OffsetConflict(Conflict):
    """A piece of input that does not start where the task's input has reached."""

    def __init__(self, written: int) -> None:
        super().__init__(
            f"the input written so far is {written} bytes: send from there", code="offset"
        )
        self.written = written

    def body(self) -> dict[str, Any]:
        return {**super().body(), "written": self.written}


@dataclass(eq=False)
class Source:
    """One output stream of one task: its FIFO (or terminal) and its journal."""

    task: JobTask
    key: str  # "o" (stdout) or "e" (stderr)
    journal: Journal
    fd: int  # the agent's non-blocking read end; -1 once it read the end
    fifo: Path | None  # None: a terminal's master side

    @property
    def done(self) -> bool:
        return self.fd < 0


class StepRun:
    def __init__(
        self,
        job_id: int,
        attempt: int,
        step_id: int,
        *,
        stepdir: Path,
        tenant: str = "",
        input_ranks: frozenset[int] = frozenset(),
        created: float | None = None,
    ) -> None:
        self.job_id, self.attempt, self.step_id = job_id, attempt, step_id
        self.stepdir = stepdir
        self.tenant = tenant
        self.input_ranks = input_ranks
        self.created = time.time() if created is None else created
        self.tasks: list[JobTask] = []
        self.sources: list[Source] = []
        self.master = -1  # a --pty task's terminal, the agent's copy of its master side
        # (rank, "stdin" or "tty") -> the holder of its input's writer or terminal's master
        self.holders: dict[tuple[int, str], subprocess.Popen[bytes]] = {}
        self.done = threading.Event()  # every task has ended and its status is known
        self.lock = threading.Lock()
        self._positions: dict[tuple[int, str], int] = {}
        self._generation = 0
        self._attached = 0
        self.detached_since: float | None = time.monotonic()
        self.delivered_at: float | None = None  # a stream sent every task's end
        self.orphaned = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._input_lock: asyncio.Lock | None = None
        self._pump: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.job_id, self.attempt, self.step_id)

    @property
    def label(self) -> str:
        return f"{self.job_id}.{self.step_id}"

    # -- signals ------------------------------------------------------------------

    def signal(self, signum: int) -> bool:
        sent = False
        for task in self.tasks:
            if task.status is None and task.signal(signum):
                sent = True
        return sent

    # -- the pump -----------------------------------------------------------------

    def start_pump(self) -> None:
        for task in self.tasks:
            for source in self.sources:
                if source.task is task:
                    self._positions.setdefault((task.rank, source.key), source.journal.size)
        self._pump = threading.Thread(
            target=self._run_pump, name=f"spurd-step-{self.label}", daemon=True
        )
        self._pump.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading, leaving the tasks be (an agent that exits leaves its steps to the
        one that comes after it, which adopts them)."""
        self._stopping.set()
        self._wake_pump()
        if self._pump is not None:
            self._pump.join(timeout)

    def _run_pump(self) -> None:
        try:
            self._pumping()
        except Exception:
            log.exception("step %s: its output pump failed; the step is killed", self.label)
            self.signal(signals.SIGKILL)
            for task in self.tasks:
                with contextlib.suppress(Exception):
                    self._finish(task)
        finally:
            for source in self.sources:
                self._close(source)
                source.journal.close()
            if self.master >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.master)
                self.master = -1
            if not self._stopping.is_set():
                self.done.set()
            self.notify()

    def _pumping(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        gone: set[int] = set()
        for task in self.tasks:
            if task.gone():
                gone.add(task.rank)
            else:
                selector.register(task.process.pidfd, selectors.EVENT_READ, task)
        reading: set[int] = set()
        try:
            while not self._stopping.is_set():
                for index, source in enumerate(self.sources):
                    ahead = source.journal.size - self._position(source)
                    want = not source.done and ahead < BACKLOG
                    if want and index not in reading:
                        selector.register(source.fd, selectors.EVENT_READ, index)
                        reading.add(index)
                    elif not want and index in reading:
                        selector.unregister(source.fd)
                        reading.discard(index)
                changed = False
                for key, _ in selector.select(timeout=1.0):
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    elif isinstance(key.data, JobTask):
                        selector.unregister(key.fd)
                        gone.add(key.data.rank)
                    else:
                        source = self.sources[key.data]
                        data = self._read(source)
                        if data is None:
                            continue
                        changed = True
                        if data:
                            source.journal.append(data)
                        else:
                            selector.unregister(source.fd)
                            reading.discard(key.data)
                            self._close(source)
                # A task that has ended has no writer left: what its FIFOs hold is read to
                # their end here (a reader opened after its writers left, an adopted
                # task's, is never told of their hang-up).
                for index, source in enumerate(self.sources):
                    if source.task.rank not in gone or source.done or index not in reading:
                        continue
                    data = self._read(source)
                    if data:
                        source.journal.append(data)
                        changed = True
                    elif data == b"":
                        selector.unregister(source.fd)
                        reading.discard(index)
                        self._close(source)
                        changed = True
                for task in self.tasks:
                    if task.status is None and task.rank in gone and self._drained_fifos(task):
                        exit_code, signum = self._finish(task)
                        log.info("step %s task %d ended: %d:%d", self.label, task.rank,
                                 exit_code, signum)  # fmt: skip
                        changed = True
                for source in self.sources:
                    source.journal.trim(self._position(source) - RETAIN)
                if changed:
                    self.notify()
                if all(task.status is not None for task in self.tasks):
                    return
        finally:
            selector.close()

    def _finish(self, task: JobTask) -> tuple[int, int]:
        """A task whose sandbox has ended and whose output was all read: its status, and
        its supervisor and terminal's holder let go."""
        status = task.ended()
        for what in ("stdin", "tty"):
            release(task.taskdir, what)
            holder = self.holders.pop((task.rank, what), None)
            if holder is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    holder.wait(timeout=5)
        return status

    def _read(self, source: Source) -> bytes | None:
        """A piece of the source; b"" at its end; None when it has nothing now."""
        try:
            return os.read(source.fd, CHUNK)
        except BlockingIOError:
            return None
        except OSError as exc:  # EIO: a terminal's slave side is closed everywhere
            if exc.errno != errno.EIO:
                log.warning("step %s task %d: %s", self.label, source.task.rank, exc)
            return b""

    def _close(self, source: Source) -> None:
        if source.fd >= 0:
            if source.fifo is not None:  # a terminal's master is self.master, closed last
                with contextlib.suppress(OSError):
                    os.close(source.fd)
            source.fd = -1

    def _drained_fifos(self, task: JobTask) -> bool:
        return all(s.done for s in self.sources if s.task is task)

    def notify(self) -> None:
        """Wake the streams waiting for output or ends (from any thread)."""
        with self.lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(event.set)

    def _wake_pump(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def _position(self, source: Source) -> int:
        with self.lock:
            return self._positions.get((source.task.rank, source.key), 0)

    # -- streams -------------------------------------------------------------------

    async def stream(self, offsets: Mapping[int, tuple[int, int]]) -> AsyncIterator[bytes]:
        """The step's output from `offsets` (rank -> (stdout, stderr) bytes already
        received), then each task's end; replaces any stream attached before."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        waiter = (loop, event)
        with self.lock:
            for source in self.sources:
                given = offsets.get(source.task.rank, (0, 0))
                at = given[0] if source.key == "o" else given[1]
                self._positions[(source.task.rank, source.key)] = min(at, source.journal.size)
            self._generation += 1
            generation = self._generation
            self._attached += 1
            self.detached_since = None
            self._waiters.add(waiter)
        self._wake_pump()
        sent: set[int] = set()
        complete = False
        quiet_since = time.monotonic()
        try:
            yield b"{}\n"  # at once: the client knows the step runs before it says anything
            while self._generation == generation:
                event.clear()
                progressed = False
                for source in self.sources:
                    line = self._next_piece(source)
                    if line is not None:
                        progressed = True
                        yield line
                for task in self.tasks:
                    if task.rank not in sent and task.status is not None and self._sent_all(task):
                        sent.add(task.rank)
                        progressed = True
                        exit_code, signum = task.status
                        yield _line({"t": task.rank, "x": exit_code, "s": signum})
                if len(sent) == len(self.tasks):
                    complete = True
                    return
                if progressed:
                    quiet_since = time.monotonic()
                    continue
                if time.monotonic() - quiet_since >= KEEP_ALIVE_S:
                    quiet_since = time.monotonic()
                    yield b"{}\n"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), 5.0)
        finally:
            with self.lock:
                self._waiters.discard(waiter)
                self._attached -= 1
                if complete:
                    self.delivered_at = time.monotonic()
                if self._attached == 0:
                    self.detached_since = None if complete else time.monotonic()

    def _next_piece(self, source: Source) -> bytes | None:
        key = (source.task.rank, source.key)
        with self.lock:
            at = self._positions.get(key, 0)
        try:
            data = source.journal.read(at)
        except Lost as lost:
            with self.lock:
                self._positions[key] = lost.at
            self._wake_pump()
            return _line({"t": source.task.rank, "lost": lost.at - at, "k": source.key})
        if not data:
            return None
        with self.lock:
            self._positions[key] = at + len(data)
        self._wake_pump()
        return _line({"t": source.task.rank, source.key: base64.b64encode(data).decode()})

    def _sent_all(self, task: JobTask) -> bool:
        with self.lock:
            return all(
                s.done and self._positions.get((task.rank, s.key), 0) >= s.journal.size
                for s in self.sources
                if s.task is task
            )

    # -- input ------------------------------------------------------------------------

    async def write_input(self, offset: int, data: bytes, eof: bool) -> dict[str, Any]:
        """srun's input from `offset` on, to the tasks here that read it; answers how
        much of it they have now (`written`: less than sent when a task reads slowly,
        INPUT_WAIT_S at most) and whether its end was delivered. A piece that does not
        start where the input has reached is refused (OffsetConflict): a replayed or
        repeated piece is never written twice."""
        if self._input_lock is None:
            self._input_lock = asyncio.Lock()
        async with self._input_lock:
            targets = [t for t in self.tasks if t.rank in self.input_ranks]
            if not targets:
                raise Conflict(f"no task of step {self.label} on this node reads srun's input")
            states = {t.rank: read_input_at(t.taskdir) for t in targets}
            position = min(written for written, _ in states.values())
            if offset != position:
                raise OffsetConflict(position)
            deadline = asyncio.get_running_loop().time() + INPUT_WAIT_S
            end = offset + len(data)
            for task in targets:
                written, ended = states[task.rank]
                if ended or written >= end:
                    continue
                piece = data[written - offset :]
                count = await self._deliver(task, piece, deadline)
                states[task.rank] = (written + count, False)
                write_input_at(task.taskdir, written + count, False)
            position = min(written for written, _ in states.values())
            delivered = all(ended for _, ended in states.values())
            if eof and position == end and not delivered:
                for task in targets:
                    if not states[task.rank][1]:
                        await self._end_input(task, deadline)
                        write_input_at(task.taskdir, end, True)
                delivered = True
            return {"written": position, "eof": delivered and eof}

    async def _deliver(self, task: JobTask, data: bytes, deadline: float) -> int:
        """Write `data` to the task's input; how much it took (all of it when the task
        no longer reads its input: what nobody reads is dropped, as a pipe's would be)."""
        if self.master >= 0 and task.rank == 0:
            return await _write(self.master, data, deadline, own=False)
        fd = open_input(task.taskdir / "stdin")
        if fd is None:
            return len(data)
        return await _write(fd, data, deadline, own=True)

    async def _end_input(self, task: JobTask, deadline: float) -> None:
        if self.master >= 0 and task.rank == 0:
            await _write(self.master, VEOF, deadline, own=False)
            return
        release(task.taskdir, "stdin")  # its holder has the FIFO's last writer

    def resize(self, cols: int, rows: int) -> None:
        if self.master < 0:
            raise Conflict(f"step {self.label} has no terminal on this node")
        set_size(self.master, cols, rows)

    def close(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


async def _write(fd: int, data: bytes, deadline: float, *, own: bool) -> int:
    """Write what the reader takes before `deadline`; close `fd` after if `own`."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    done = 0
    try:
        while done < len(view):
            try:
                done += os.write(fd, view[done:])
                continue
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.EIO):  # nobody reads it any more
                    return len(view)
                raise
            left = deadline - loop.time()
            if left <= 0:
                break
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _settle, ready)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready, left)
            finally:
                loop.remove_writer(fd)
        return done
    finally:
        if own:
            os.close(fd)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _line(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, separators=(",", ":")) + "\n").encode()


def parse_offsets(value: Any) -> dict[int, tuple[int, int]]:
    """`[[rank, stdout bytes, stderr bytes], ...]`, what a client has received."""
    if not isinstance(value, list) or len(value) > MAX_STEP_TASKS:
        raise Refused("offsets must be a list of [rank, stdout bytes, stderr bytes]")
    found: dict[int, tuple[int, int]] = {}
    for entry in value:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in entry)
        ):
            raise Refused("offsets must be a list of [rank, stdout bytes, stderr bytes]")
        found[int(entry[0])] = (int(entry[1]), int(entry[2]))
    return found


__all__ = ["INPUT_WAIT_S", "OffsetConflict", "Source", "StepRun", "parse_offsets"]
