"""How a job's end is seen and reported: its waiter (`_wait_for`, on one of the
launcher's kept threads) waits for its sandbox to end and reads how it ended (an exit,
a signal the agent sent, memory, the lease); `_finish` reports it, durably, then marks
it in the job's record; `_fail` ends a job that could not start. The waiters' threads
(`_Waiters`) are kept from one job to the next.

A mixin of `Launcher` (its own methods, kept in their own file, as
scheduler/core/transitions.py is of `ClusterState`): the attributes it declares below
are all it reads of the launcher.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal as signals
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents import jobrecord
from agents.jobprocess import decode_status
from agents.limits import Enforcement, read_tail
from agents.reports import Reporter
from agents.steps import StepRunner
from agents.workspace import DEV_NULL, JobFiles, open_beneath
from scheduler.client import JobReport

if TYPE_CHECKING:
    from agents.launcher import _Job

log = logging.getLogger("agents.launcher")  # the launcher's log, as before the split

OUT_OF_MEMORY = "OutOfMemory"  # the reason the controller maps to OUT_OF_MEMORY
_SUPERVISOR_LOST = "the node's job supervisor died: the job ended with it, its exit status unknown"
FENCED = "fenced: the node's lease ran out (no heartbeat the controller acknowledged)"


class JobEnding:
    node: str
    steps: StepRunner
    limits: Enforcement
    _reporter: Reporter

    def _fail(self, entry: _Job, jobdir: Path, reason: str) -> None:
        request = entry.request
        log.error("job %s.%s failed to launch: %s", *request.key, reason)
        # Kept in the spool, never written into the tenant's files as root: the output
        # route serves it in place of an output file that never came to be.
        with contextlib.suppress(OSError), open(jobdir / "launch-error", "a") as f:
            f.write(f"spurd: error: job {request.job_id}: {reason}\n")
        self._finish(entry, jobdir, exit_code=1, signal=0, reason=reason)

    def _wait_for(self, entry: _Job, jobdir: Path, files: JobFiles) -> None:
        process, request = entry.process, entry.request
        assert process is not None
        if not process.wait_ready():
            reason = process.errors()
            process.reap()
            self.limits.release(jobdir.name)
            self._fail(entry, jobdir, f"the job could not start: {reason}")
            return
        self._reporter.report(
            JobReport(
                "started",
                request.job_id,
                request.attempt,
                self.node,
                pid=process.init_pid,
                limits=self.limits.kind,
            )
        )
        process.wait_monitor()
        # Like slurmstepd: the job ends with its script; what it left running dies.
        returncode = process.reap()
        if returncode is None:
            self.limits.release(jobdir.name)
            log.error("job %s.%s: %s", *request.key, _SUPERVISOR_LOST)
            self._finish(entry, jobdir, exit_code=1, signal=0, reason=_SUPERVISOR_LOST)
            return
        exit_code, signum = decode_status(returncode, process.delivered)
        # A job ended by a signal this agent sent (a cancel, a time limit) did not fail.
        failed = (exit_code, signum) != (0, 0) and signum not in process.delivered
        oom = self.limits.out_of_memory(
            jobdir.name, failed=failed, error_tail=lambda: _error_tail(files)
        )
        self.limits.release(jobdir.name)
        reason = OUT_OF_MEMORY if oom else ""
        if jobrecord.fenced(jobdir):
            exit_code, signum, reason = 0, int(signals.SIGKILL), FENCED
        log.info("job %s.%s ended: %d:%d%s", *request.key, exit_code, signum, " (OOM)" * oom)
        self._finish(entry, jobdir, exit_code=exit_code, signal=signum, reason=reason, oom=oom)

    def _finish(
        self,
        entry: _Job,
        jobdir: Path,
        *,
        exit_code: int,
        signal: int,
        reason: str,
        oom: bool = False,
    ) -> None:
        request = entry.request
        # Like slurmstepd: the job's steps on this node end with it.
        self.steps.signal(request.job_id, request.attempt, signals.SIGKILL)
        entry.exit_code, entry.signal, entry.reason = exit_code, signal, reason
        # The report first (a durable reporter keeps it in the outbox), then the mark that
        # it was made: an agent that dies in between reports the end again, which the
        # controller takes as the duplicate it is.
        self._reporter.report(
            JobReport(
                "finished",
                request.job_id,
                request.attempt,
                self.node,
                exit_code=exit_code,
                signal=signal,
                reason=reason,
                oom=oom,
            )
        )
        try:
            jobrecord.append(jobdir, exit=[exit_code, signal])
        except OSError as exc:
            log.warning("cannot record the end of job %s.%s: %s", *request.key, exc)
        entry.finished.set()


def _error_tail(files: JobFiles) -> bytes:
    path = files.stderr or files.stdout
    if path == DEV_NULL:
        return b""
    return read_tail(open_beneath(files.workspace, path))


class _Waiters:
    """Threads that wait on jobs, each kept for the next job once its own has ended:
    starting a thread costs the launch that starts it a few milliseconds (it waits for
    the new thread to run), on the path to the job's start. Daemons, like the jobs'
    waiters before them: an agent that stops leaves its jobs running."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, task: Callable[..., None], *args: Any) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._tasks.put((task, args))
        if spawn:
            threading.Thread(target=self._work, name="spurd-waiter", daemon=True).start()

    def _work(self) -> None:
        while True:
            task, args = self._tasks.get()
            try:
                task(*args)
            except Exception:
                log.exception("a job's waiter failed")
            with self._lock:
                self._idle += 1
