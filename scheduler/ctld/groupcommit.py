"""Group commit: the commands that arrive while a Raft round is in flight go into the
next round together, as one log entry (`commands.Batch`).

A Raft round costs the same for one command as for many (a journal write and fsync on
each replica, a round trip to the followers), so committing one command a round caps
the controller at one command per round trip, however many clients wait. Here the
commands queue, and whenever a slot is free every command queued (up to `max_batch`)
is proposed as one entry; each caller gets its own outcome. A lone command is proposed
as itself, so a quiet controller's log reads as before.

Up to `max_in_flight` entries are proposed before the first is committed: with a few
clients a round spends most of its time on the wire and the disk, and the next entry
can travel meanwhile. Entries are proposed by one thread at a time, in the order their
commands queued (`_pump`: whoever queues a command or frees a slot proposes, with no
hand-over to a thread of its own), and Raft commits entries in the order they were
proposed, so the log, and every replica applying it, is the same as with one entry at a
time; only the waiting overlaps.

A caller waits on a thread (`commit`, `commit_all`) or on its event loop
(`commit_async`, `commit_all_async`): the event loop's waiters are asyncio futures,
resolved with `loop.call_soon_threadsafe` once per entry, so an HTTP route awaits its
commit without a thread parked per command.

Every replica applies a batch's commands in order, each on its own
(`ClusterState.apply_each`): one refused changes nothing and refuses none of the others.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.core import commands as c

log = logging.getLogger(__name__)

# Outcome of one command, as the replicated apply gives it: ("ok", result, "") or
# ("rejected", message, code).
Outcome = tuple[str, Any, str]
# Told once an entry was applied here (its commands' outcomes, in order), or could not
# be committed (the error, and None). Called on any thread, at most once.
Done = Callable[[list[Outcome] | None, BaseException | None], None]
# Proposes one log entry and returns at once; calls `done` once it was applied here.
Start = Callable[[c.Command, Done], None]
# Proposes one log entry and waits until it is applied here: the outcome of each of the
# entry's commands, in order. Raises when the entry could not be committed.
Propose = Callable[[c.Command], list[Outcome]]

MAX_BATCH = 512  # commands in one log entry (a submission is a few KiB pickled)
MAX_IN_FLIGHT = 2  # entries proposed and not yet committed
ENTRY_TIMEOUT_S = 10.0  # an entry not committed by then frees its slot (its waiters fail)
WATCH_INTERVAL_S = 0.1  # how often the deadlines of the entries in flight are checked


def blocking(propose: Propose) -> Start:
    """A `Start` from a proposal that waits for its own commit (tests, and anything
    without a callback API): proposals run one after another, in order, on a thread of
    their own (a daemon, for the life of the process)."""
    work: queue.SimpleQueue[tuple[c.Command, Done]] = queue.SimpleQueue()

    def proposer() -> None:
        while True:
            entry, done = work.get()
            try:
                outcomes = propose(entry)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiters
                done(None, exc)
                continue
            done(outcomes, None)

    threading.Thread(target=proposer, name="blocking-propose", daemon=True).start()

    def start(entry: c.Command, done: Done) -> None:
        work.put((entry, done))

    return start


class _Waiter:
    """One command's caller: a thread (`event`) or an event loop (`loop`, `future`)."""

    __slots__ = ("command", "error", "event", "future", "loop", "outcome")

    def __init__(self, command: c.Command, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.command = command
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None
        self.loop = loop
        self.future: asyncio.Future[Outcome] | None = None
        self.event: threading.Event | None = None
        if loop is None:
            self.event = threading.Event()
        else:
            self.future = loop.create_future()


def _settle(settled: list[tuple[_Waiter, Outcome | None, BaseException | None]]) -> None:
    """On the waiters' event loop: resolve their futures (a caller that gave up, its
    future cancelled, is skipped)."""
    for waiter, outcome, error in settled:
        future = waiter.future
        assert future is not None
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome)  # type: ignore[arg-type]


def _expire(future: asyncio.Future[Outcome], cmd_id: str, timeout: float) -> None:
    """On the waiter's event loop, at its timeout: fail its future if no outcome came."""
    if not future.done():
        future.set_exception(TimeoutError(f"command {cmd_id} not committed in {timeout} s"))


def _expire_all(waiters: list[_Waiter], timeout: float) -> None:
    for waiter in waiters:
        assert waiter.future is not None
        _expire(waiter.future, waiter.command.cmd_id, timeout)


class _Entry:
    __slots__ = ("deadline", "settled", "waiters")

    def __init__(self, waiters: list[_Waiter], deadline: float) -> None:
        self.waiters = waiters
        self.deadline = deadline
        self.settled = False


class GroupCommit:
    def __init__(
        self,
        start: Start,
        *,
        max_batch: int = MAX_BATCH,
        max_in_flight: int = MAX_IN_FLIGHT,
        entry_timeout_s: float = ENTRY_TIMEOUT_S,
    ) -> None:
        self._start = start
        self._max_batch = max_batch
        self._max_in_flight = max(1, max_in_flight)
        self._entry_timeout_s = entry_timeout_s
        self._queue: deque[_Waiter] = deque()
        self._in_flight: deque[_Entry] = deque()
        self._ready = threading.Condition()
        self._stopped = False
        # The watcher sleeps on this, not on `_ready`: it is not woken by every entry.
        self._stopping = threading.Event()
        self._pumping = False  # a thread is proposing (`_pump`)
        self._batch_ids = itertools.count(1)
        self._batch_prefix = uuid.uuid4().hex[:16]
        self.rounds = 0  # log entries committed (bench/raft.py, tests)
        self.committed = 0  # commands in them
        self._thread = threading.Thread(target=self._watch, name="group-commit", daemon=True)
        self._thread.start()

    # -- callers on threads ---------------------------------------------------------

    def commit(self, command: c.Command, *, timeout: float) -> Outcome:
        """The outcome of `command` once committed and applied here. TimeoutError if that
        takes longer than `timeout` (the command may still commit later); whatever the
        proposal raised if its entry could not be committed."""
        return self.commit_all([command], timeout=timeout)[0]

    def commit_all(self, commands: Sequence[c.Command], *, timeout: float) -> list[Outcome]:
        """Several commands queued at once (so they share a round), their outcomes in
        order."""
        waiters = [_Waiter(command) for command in commands]
        self._enqueue(waiters)
        deadline = time.monotonic() + timeout
        outcomes: list[Outcome] = []
        for waiter in waiters:
            assert waiter.event is not None
            if not waiter.event.wait(max(deadline - time.monotonic(), 0.0)):
                raise TimeoutError(f"command {waiter.command.cmd_id} not committed in {timeout} s")
            if waiter.error is not None:
                raise waiter.error
            assert waiter.outcome is not None
            outcomes.append(waiter.outcome)
        return outcomes

    # -- callers on an event loop ---------------------------------------------------

    async def commit_async(self, command: c.Command, *, timeout: float) -> Outcome:
        """`commit`, awaited on the running event loop. Its timeout is a timer that
        fails the waiter's future (`_expire`), not `asyncio.timeout`, whose context
        manager costs twice as much on every request (the task's cancel and uncancel
        bookkeeping) for the same outcome: a TimeoutError, and the future done so its
        late outcome is dropped (`_settle`)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(command, loop)
        future = waiter.future
        assert future is not None
        self._enqueue([waiter])
        timer = loop.call_later(timeout, _expire, future, command.cmd_id, timeout)
        try:
            return await future
        finally:
            timer.cancel()

    async def commit_all_async(
        self, commands: Sequence[c.Command], *, timeout: float
    ) -> list[Outcome]:
        """`commit_all`, awaited on the running event loop: no thread waits for it. One
        timer fails every waiter without an outcome at the timeout (`_expire`, as for
        `commit_async`), and the futures are awaited in order: `asyncio.gather` and
        `asyncio.timeout` cost a future, a callback per command and the task's cancel
        bookkeeping on every request, for the same outcome (the first waiter without an
        outcome raises TimeoutError naming its command)."""
        loop = asyncio.get_running_loop()
        waiters = [_Waiter(command, loop) for command in commands]
        self._enqueue(waiters)
        timer = loop.call_later(timeout, _expire_all, waiters, timeout)
        try:
            outcomes = []
            for waiter in waiters:
                assert waiter.future is not None
                outcomes.append(await waiter.future)
            return outcomes
        finally:
            timer.cancel()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or in flight, `timeout` at most: whether it is."""
        with self._ready:
            return self._ready.wait_for(
                lambda: not self._queue and not self._in_flight, timeout=timeout
            )

    # -- proposing ----------------------------------------------------------------------

    def _enqueue(self, waiters: list[_Waiter]) -> None:
        with self._ready:
            if self._stopped:
                raise RuntimeError("the controller is shutting down")
            self._queue.extend(waiters)
        self._pump()

    def _pump(self) -> None:
        """Propose while commands wait and a slot is free. Whoever frees a slot or
        queues a command pumps (the caller's thread, the event loop, the Raft thread
        that applied an entry): no thread hand-over on the way to the log. One pumps
        at a time, so entries are proposed in the order their commands queued; the
        others leave their work to it (it looks again before it stops)."""
        with self._ready:
            if self._pumping:
                return
            self._pumping = True
        try:
            while True:
                with self._ready:
                    if (
                        self._stopped
                        or not self._queue
                        or len(self._in_flight) >= self._max_in_flight
                    ):
                        self._pumping = False
                        return
                    count = min(len(self._queue), self._max_batch)
                    batch = [self._queue.popleft() for _ in range(count)]
                    entry = _Entry(batch, time.monotonic() + self._entry_timeout_s)
                    self._in_flight.append(entry)
                if len(batch) == 1:
                    command = batch[0].command
                else:
                    command = c.Batch(self._new_id(), time.time(), tuple(w.command for w in batch))
                try:
                    self._start(command, functools.partial(self._done, entry))
                except BaseException as exc:  # noqa: BLE001 - every waiter gets it
                    self._done(entry, None, exc)
        except BaseException:
            with self._ready:
                self._pumping = False
            raise

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()
        self._stopping.set()
        self._thread.join(timeout=5)
        with self._ready:
            left = [_Entry(list(self._queue), 0.0), *self._in_flight]
            self._queue.clear()
            self._in_flight.clear()
            for entry in left:
                entry.settled = True
        for entry in left:
            self._finish(entry, None, RuntimeError("the controller is shutting down"))

    def _watch(self) -> None:
        """Fail the entries in flight past their deadline (a proposal Raft never
        answered: a leader deposed mid-round), freeing their slots."""
        while True:
            self._stopping.wait(WATCH_INTERVAL_S)
            with self._ready:
                if self._stopped:
                    return
                now = time.monotonic()
                expired = [e for e in self._in_flight if e.deadline <= now]
                for entry in expired:
                    self._in_flight.remove(entry)
                    entry.settled = True
                if expired:
                    self._ready.notify_all()
            for entry in expired:
                self._finish(entry, None, TimeoutError("entry not committed in time"))
            if expired:
                self._pump()

    def _new_id(self) -> str:
        return f"{self._batch_prefix}{next(self._batch_ids):016x}"

    def _done(
        self, entry: _Entry, outcomes: list[Outcome] | None, error: BaseException | None
    ) -> None:
        with self._ready:
            if entry.settled:  # failed at its deadline, or at shutdown, already
                return
            entry.settled = True
            if entry in self._in_flight:
                self._in_flight.remove(entry)
            if error is None:
                self.rounds += 1
                self.committed += len(entry.waiters)
            self._ready.notify_all()
        self._finish(entry, outcomes, error)
        self._pump()  # the slot it freed

    def _finish(
        self, entry: _Entry, outcomes: list[Outcome] | None, error: BaseException | None
    ) -> None:
        """Hand each waiter its outcome: threads at once, event loops one call each
        (the entry is `settled` already: this runs once for it)."""
        if error is None and (outcomes is None or len(outcomes) != len(entry.waiters)):
            error = RuntimeError("the entry's outcomes do not match its commands")
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for i, waiter in enumerate(entry.waiters):
            outcome = None if error is not None or outcomes is None else outcomes[i]
            if waiter.loop is None:
                waiter.outcome, waiter.error = outcome, error
                assert waiter.event is not None
                waiter.event.set()
            else:
                by_loop.setdefault(waiter.loop, []).append((waiter, outcome, error))
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, settled)
            except RuntimeError:  # the loop closed: nobody waits there any more
                log.debug("event loop closed before %d outcome(s) arrived", len(settled))
