"""Group commit: the commands that arrive while a Raft round is in flight go into the
next round together, as one log entry (`commands.Batch`).

A Raft round costs the same for one command as for many (a journal write and fsync on
each replica, a round trip to the followers), so committing one command a round caps
the controller at one command per round trip, however many clients wait. Here one
thread proposes: it takes every command queued (up to `max_batch`), proposes them as
one entry, and hands each caller its own outcome; meanwhile the next commands queue up.
A lone command is proposed as itself, so a quiet controller's log reads as before.

Every replica applies a batch's commands in order, each on its own
(`ClusterState.apply_each`): one refused changes nothing and refuses none of the others.
"""

from __future__ import annotations

import logging
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
# Proposes one log entry and waits until it is applied here: the outcome of each of the
# entry's commands, in order. Raises when the entry could not be committed.
Propose = Callable[[c.Command], list[Outcome]]

MAX_BATCH = 512  # commands in one log entry (a submission is a few KiB pickled)


class _Waiter:
    __slots__ = ("command", "done", "error", "outcome")

    def __init__(self, command: c.Command) -> None:
        self.command = command
        self.done = threading.Event()
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None


class GroupCommit:
    def __init__(self, propose: Propose, *, max_batch: int = MAX_BATCH) -> None:
        self._propose = propose
        self._max_batch = max_batch
        self._queue: deque[_Waiter] = deque()
        self._ready = threading.Condition()
        self._stopped = False
        self.rounds = 0  # log entries proposed (bench/raft.py, tests)
        self.committed = 0  # commands in them
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def commit(self, command: c.Command, *, timeout: float) -> Outcome:
        """The outcome of `command` once committed and applied here. TimeoutError if that
        takes longer than `timeout` (the command may still commit later); whatever the
        proposal raised if its entry could not be committed."""
        return self.commit_all([command], timeout=timeout)[0]

    def commit_all(self, commands: Sequence[c.Command], *, timeout: float) -> list[Outcome]:
        """Several commands queued at once (so they share a round), their outcomes in
        order."""
        waiters = [_Waiter(command) for command in commands]
        with self._ready:
            if self._stopped:
                raise RuntimeError("the controller is shutting down")
            self._queue.extend(waiters)
            self._ready.notify()
        deadline = time.monotonic() + timeout
        outcomes: list[Outcome] = []
        for waiter in waiters:
            if not waiter.done.wait(max(deadline - time.monotonic(), 0.0)):
                raise TimeoutError(f"command {waiter.command.cmd_id} not committed in {timeout} s")
            if waiter.error is not None:
                raise waiter.error
            assert waiter.outcome is not None
            outcomes.append(waiter.outcome)
        return outcomes

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()
        self._thread.join(timeout=5)
        for waiter in self._queue:
            waiter.error = RuntimeError("the controller is shutting down")
            waiter.done.set()

    def _next_batch(self) -> list[_Waiter] | None:
        with self._ready:
            while not self._queue and not self._stopped:
                self._ready.wait()
            if self._stopped:
                return None
            count = min(len(self._queue), self._max_batch)
            return [self._queue.popleft() for _ in range(count)]

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            if len(batch) == 1:
                entry = batch[0].command
            else:
                entry = c.Batch(uuid.uuid4().hex, time.time(), tuple(w.command for w in batch))
            try:
                outcomes = self._propose(entry)
            except BaseException as exc:  # noqa: BLE001 - every waiter gets it, the loop goes on
                for waiter in batch:
                    waiter.error = exc
                    waiter.done.set()
                continue
            self.rounds += 1
            self.committed += len(batch)
            for waiter, outcome in zip(batch, outcomes, strict=True):
                waiter.outcome = outcome
                waiter.done.set()
