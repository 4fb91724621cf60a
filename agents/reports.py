"""Job reports from the agent to the controller, delivered even when the controller is down.

The launcher talks to a `Reporter`. In production that is a `ReportQueue` in front of the
`ControllerClient`: the launcher's call returns at once, and one background thread sends
the reports in order, retrying with backoff until the controller acknowledges each one.
A job's `finished` must never be lost (the controller would hold its GPUs forever), and
must never overtake its `started`, hence one FIFO and head-of-line retries.

What the queue holds goes out together: a sink that takes batches (`BatchReporter`, the
`ControllerClient`'s `POST /v1/reports`) gets up to `MAX_REPORT_BATCH` reports from the
head of the queue in one request, committed in order in one log entry, each answered on
its own: those acknowledged or refused leave the queue, and the first that failed for a
passing reason (and every report after it, so that nothing overtakes it) is retried. A
controller without the route (404 for the request itself) gets one report a request, as
before.

With an `outbox` (the agent's `<spool>/outbox`), the queue is durable: each report is
written there (one file, renamed into place) before `report` returns, deleted once the
controller acknowledged (or refused) it, and a queue that starts on an outbox sends what
an earlier agent left there first, in the order it was made. The controller takes
reports idempotently by (job, attempt), so a report sent twice (an agent died between
the answer and the deletion) changes nothing. No fsync: the outbox outlives the agent's
process, not the machine (whose jobs die with it, and which the controller fails).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Protocol, runtime_checkable

from scheduler.client import MAX_REPORT_BATCH, JobReport
from scheduler.rpc.errors import Conflict, NotFound, Refused, RpcError

log = logging.getLogger(__name__)


class Reporter(Protocol):
    """What the launcher tells the controller. `ControllerClient` has this shape."""

    def report(self, report: JobReport) -> None: ...


@runtime_checkable
class BatchReporter(Reporter, Protocol):
    """A sink that also takes several reports in one call: for each, None (taken) or the
    error that refused that one alone. `ControllerClient` has this shape."""

    def report_all(self, reports: Sequence[JobReport]) -> list[RpcError | None]: ...


def is_transient(exc: Exception) -> bool:
    """Whether sending again may succeed. A refusal, a 404 or a conflict never will."""
    return not isinstance(exc, Refused | NotFound | Conflict)


class ReportQueue:
    """A `Reporter` that queues in memory and sends from a background thread."""

    def __init__(
        self,
        sink: Reporter,
        *,
        outbox: str | os.PathLike[str] | None = None,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._sink = sink
        self._outbox = None if outbox is None else Path(outbox)
        self._initial_backoff = initial_backoff_s
        self._max_backoff = max_backoff_s
        self._batches = isinstance(sink, BatchReporter)
        # Each report with its file in the outbox (None: not durable).
        self._queue: deque[tuple[JobReport, Path | None]] = deque()
        self._next = 0  # the number of the next outbox file (they sort in order)
        self._wake = False
        self._cond = threading.Condition()
        self._stopping = False
        self._sending = False
        self._thread = threading.Thread(target=self._run, name="spurd-reports", daemon=True)

    def start(self) -> ReportQueue:
        """Load what the outbox holds (an earlier agent's unsent reports), then send."""
        if self._outbox is not None:
            self._outbox.mkdir(parents=True, exist_ok=True, mode=0o700)
            with self._cond:
                for path in sorted(self._outbox.glob("*.json")):
                    try:
                        report = JobReport.from_dict(json.loads(path.read_text()))
                    except (OSError, ValueError, KeyError, TypeError) as exc:
                        log.error("dropping unreadable report %s: %s", path, exc)
                        path.unlink(missing_ok=True)
                        continue
                    self._queue.append((report, path))
                    self._next = max(self._next, int(path.name.split(".", 1)[0]) + 1)
                if self._queue:
                    log.info("resending %d report(s) from the outbox", len(self._queue))
        self._thread.start()
        return self

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop sending; reports still queued stay in the outbox (logged without one)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for report, path in self._queue:
            if path is None:
                log.warning("unsent report at shutdown: %s", report)
            else:
                log.info("report kept in the outbox for the next start: %s", report)

    def wake(self) -> None:
        """Retry at once, not after the backoff (the controller was just reached)."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def unacknowledged_ends(self) -> list[tuple[int, int]]:
        """The (job, attempt) of each `finished` report not yet acknowledged: the
        heartbeat lists them with the running jobs, so that the controller waits for
        their report (late, behind a paused replica) instead of taking them as vanished."""
        with self._cond:
            return [(r.job_id, r.attempt) for r, _ in self._queue if r.kind == "finished"]

    def flush(self, timeout: float) -> bool:
        """Wait until every queued report is acknowledged (for shutdown and tests)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._queue and not self._sending, timeout=timeout
            )

    def report(self, report: JobReport) -> None:
        with self._cond:
            path = self._persist(report)
            self._queue.append((report, path))
            self._cond.notify_all()

    def _persist(self, report: JobReport) -> Path | None:
        """Write the report to the outbox (under the lock: files are numbered in order)."""
        if self._outbox is None:
            return None
        number = self._next
        self._next += 1
        name = f"{number:012d}.{report.job_id}.{report.attempt}.{report.kind}.json"
        path = self._outbox / name
        tmp = self._outbox / f".{name}.tmp"
        try:
            tmp.write_text(json.dumps(report.to_dict()))
            os.replace(tmp, path)
        except OSError as exc:
            log.error("cannot keep report %s in the outbox (%s): kept in memory", report, exc)
            return None
        return path

    def _run(self) -> None:
        backoff = self._initial_backoff
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if self._stopping:
                    return
                size = MAX_REPORT_BATCH if self._batches else 1
                batch = list(islice(self._queue, size))
                self._sending = True
                self._wake = False
            answers, failure = self._send(batch)
            for (report, path), answer in zip(batch, answers, strict=False):
                if answer is not None:
                    log.error("controller refused report %s: %s; dropping it", report, answer)
                self._acknowledged(report, path)
            if failure is None:
                backoff = self._initial_backoff
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()
                continue
            report = batch[len(answers)][0]
            log.warning("report %s not delivered (%s); retry in %.1fs", report, failure, backoff)
            with self._cond:
                self._sending = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._stopping or self._wake, timeout=backoff)
            backoff = min(backoff * 2, self._max_backoff)

    def _send(
        self, batch: list[tuple[JobReport, Path | None]]
    ) -> tuple[list[Exception | None], Exception | None]:
        """Send the head of the queue: the answer of each report taken (None, or the
        refusal that dropped it), in order, and the passing failure that stopped the
        rest (None when every one was answered)."""
        reports = [report for report, _ in batch]
        try:
            if len(reports) == 1 and not self._batches:
                self._sink.report(reports[0])
                return [None], None
            assert isinstance(self._sink, BatchReporter)
            results: list[Exception | None] = list(self._sink.report_all(reports))
        except NotFound as exc:
            if len(reports) > 1 or self._batches:
                # A controller that predates the batch route: one report a request.
                log.warning("the controller takes no batch of reports (%s): one by one", exc)
                self._batches = False
                return [], exc
            return [exc], None
        except Exception as exc:  # noqa: BLE001 - any failure is retried or dropped below
            if is_transient(exc):
                return [], exc
            return [exc], None
        for i, result in enumerate(results):
            if result is not None and is_transient(result):
                return results[:i], result
        return results, None

    def _acknowledged(self, report: JobReport, path: Path | None) -> None:
        """The controller answered `report`: it leaves the outbox and the queue."""
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
        with self._cond:
            if self._queue and self._queue[0][0] is report:
                self._queue.popleft()
            self._cond.notify_all()
