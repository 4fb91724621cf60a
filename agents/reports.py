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
before. Requests are at least `interval_s` apart (0.1 s): a report that comes after a
quiet spell goes at once, and under load each request carries what came meanwhile (a
short job's `started` and `finished` together, and its neighbours'), rather than one
request, and one log entry in the controller, a report. The price: under load a job's
GPUs are freed up to 0.1 s later than they could be.

With an `outbox` (the agent's `<spool>/outbox`), the queue is durable: each report is
appended to the outbox's journal (one line, `{"n", "report"}`) before `report` returns,
and marked done (`{"done": [n, ...]}`) once the controller acknowledged (or refused)
it; a queue that starts on an outbox sends what an earlier agent left there unmarked
first, in the order it was made (and what an agent of an earlier version left there as
one file a report). An append costs no file of its own: on a busy spool, creating and
deleting two files a job cost more than sending the reports. The journal is rewritten
with what is pending at each start, and emptied whenever nothing is pending and it has
grown past `COMPACT_BYTES`. The controller takes reports idempotently by (job, attempt),
so a report sent twice (an agent died between the answer and the mark) changes nothing.
No fsync: the outbox outlives the agent's process, not the machine (whose jobs die with
it, and which the controller fails).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Protocol, runtime_checkable

from scheduler.client import MAX_REPORT_BATCH, JobReport
from scheduler.rpc.errors import Conflict, NotFound, Refused, RpcError

log = logging.getLogger(__name__)

JOURNAL = "journal"
COMPACT_BYTES = 1 << 20
REPORT_INTERVAL_S = 0.1


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
        interval_s: float = REPORT_INTERVAL_S,
    ) -> None:
        self._sink = sink
        self._outbox = None if outbox is None else Path(outbox)
        self._initial_backoff = initial_backoff_s
        self._max_backoff = max_backoff_s
        self._interval = interval_s
        self._batches = isinstance(sink, BatchReporter)
        # Each report with its number in the outbox's journal (None: not durable).
        self._queue: deque[tuple[JobReport, int | None]] = deque()
        self._journal = -1  # the journal, open for appending
        self._next = 0  # the number of the next report in the journal
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
                self._open_journal(outbox_reports(self._outbox))
                if self._queue:
                    log.info("resending %d report(s) from the outbox", len(self._queue))
        self._thread.start()
        return self

    def _open_journal(self, pending: list[JobReport]) -> None:
        """A journal holding `pending` alone, open for appending; the files of an agent
        of an earlier version gone once their reports are in it."""
        assert self._outbox is not None
        lines = [_journal_line(n, report) for n, report in enumerate(pending)]
        tmp = self._outbox / f".{JOURNAL}.tmp"
        try:
            tmp.write_text("".join(lines))
            os.replace(tmp, self._outbox / JOURNAL)
            self._journal = os.open(
                self._outbox / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
            )
        except OSError as exc:
            log.error("cannot keep reports in the outbox (%s): they are kept in memory", exc)
            self._queue.extend((report, None) for report in pending)
            return
        for path in self._outbox.glob("*.json"):
            path.unlink(missing_ok=True)
        self._queue.extend((report, n) for n, report in enumerate(pending))
        self._next = len(pending)

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop sending; reports still queued stay in the outbox (logged without one)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for report, n in self._queue:
            if n is None:
                log.warning("unsent report at shutdown: %s", report)
            else:
                log.info("report kept in the outbox for the next start: %s", report)
        with self._cond:
            if self._journal >= 0:
                os.close(self._journal)
                self._journal = -1

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
            n = self._persist(report)
            self._queue.append((report, n))
            self._cond.notify_all()

    def _persist(self, report: JobReport) -> int | None:
        """Append the report to the journal (under the lock: in the order they come)."""
        if self._journal < 0:
            return None
        n = self._next
        self._next += 1
        try:
            os.write(self._journal, _journal_line(n, report).encode())
        except OSError as exc:
            log.error("cannot keep report %s in the outbox (%s): kept in memory", report, exc)
            return None
        return n

    def _run(self) -> None:
        backoff = self._initial_backoff
        last_sent = float("-inf")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                size = MAX_REPORT_BATCH if self._batches else 1
                # Under load, one request an interval, with what came meanwhile.
                while not (self._stopping or self._wake or len(self._queue) >= size):
                    left = last_sent + self._interval - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._stopping:
                    return
                batch = list(islice(self._queue, size))
                self._sending = True
                self._wake = False
            last_sent = time.monotonic()
            answers, failure = self._send(batch)
            for (report, _), answer in zip(batch, answers, strict=False):
                if answer is not None:
                    log.error("controller refused report %s: %s; dropping it", report, answer)
            self._acknowledged(batch[: len(answers)])
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
        self, batch: list[tuple[JobReport, int | None]]
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

    def _acknowledged(self, answered: list[tuple[JobReport, int | None]]) -> None:
        """The controller answered these, the head of the queue: they are marked done in
        the journal and leave the queue."""
        if not answered:
            return
        with self._cond:
            done = [n for _, n in answered if n is not None]
            if done and self._journal >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._journal, (json.dumps({"done": done}) + "\n").encode())
            for report, _ in answered:
                if self._queue and self._queue[0][0] is report:
                    self._queue.popleft()
            if not self._queue and self._journal >= 0:
                self._compact()
            self._cond.notify_all()

    def _compact(self) -> None:
        """Nothing is pending: a journal grown large starts again empty."""
        with contextlib.suppress(OSError):
            if os.fstat(self._journal).st_size > COMPACT_BYTES:
                os.ftruncate(self._journal, 0)


def _journal_line(n: int, report: JobReport) -> str:
    return json.dumps({"n": n, "report": report.to_dict()}) + "\n"


def outbox_reports(outbox: Path) -> list[JobReport]:
    """What an outbox holds unacknowledged, in the order it was made: the reports of
    its journal not marked done, after those an agent of an earlier version left in it
    as one file each. A line that cannot be read (an agent died writing it) is skipped:
    its report never left `report`, and is made again."""
    pending: list[JobReport] = []
    for path in sorted(outbox.glob("*.json")):
        try:
            pending.append(JobReport.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("dropping unreadable report %s: %s", path, exc)
    journal: dict[int, JobReport] = {}
    try:
        lines = (outbox / JOURNAL).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
            if "done" in record:
                for n in record["done"]:
                    journal.pop(int(n), None)
            else:
                journal[int(record["n"])] = JobReport.from_dict(record["report"])
        except (ValueError, KeyError, TypeError, AttributeError):
            log.error("skipping an unreadable line of %s: %.80r", outbox / JOURNAL, line)
    return pending + [journal[n] for n in sorted(journal)]
