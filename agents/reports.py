"""Job reports from the agent to the controller, delivered even when the controller is down.

The launcher talks to a `Reporter`. In production that is a `ReportQueue` in front of the
`ControllerClient`: the launcher's call returns at once, and one background thread sends
the reports in order, retrying with backoff until the controller acknowledges each one.
A job's `finished` must never be lost (the controller would hold its GPUs forever), and
must never overtake its `started`, hence one FIFO and head-of-line retries.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Protocol

from scheduler.client import JobReport
from scheduler.rpc.errors import Conflict, NotFound, Refused

log = logging.getLogger(__name__)


class Reporter(Protocol):
    """What the launcher tells the controller. `ControllerClient` has this shape."""

    def report(self, report: JobReport) -> None: ...


def is_transient(exc: Exception) -> bool:
    """Whether sending again may succeed. A refusal, a 404 or a conflict never will."""
    return not isinstance(exc, Refused | NotFound | Conflict)


class ReportQueue:
    """A `Reporter` that queues in memory and sends from a background thread."""

    def __init__(
        self,
        sink: Reporter,
        *,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        self._sink = sink
        self._initial_backoff = initial_backoff_s
        self._max_backoff = max_backoff_s
        self._queue: deque[JobReport] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._sending = False
        self._thread = threading.Thread(target=self._run, name="spurd-reports", daemon=True)

    def start(self) -> ReportQueue:
        self._thread.start()
        return self

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop sending; reports still queued are logged, not sent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for report in self._queue:
            log.warning("unsent report at shutdown: %s", report)

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued report is acknowledged (for shutdown and tests)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._queue and not self._sending, timeout=timeout
            )

    def report(self, report: JobReport) -> None:
        with self._cond:
            self._queue.append(report)
            self._cond.notify_all()

    def _run(self) -> None:
        backoff = self._initial_backoff
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if self._stopping:
                    return
                report = self._queue[0]
                self._sending = True
            try:
                self._sink.report(report)
            except Exception as exc:  # noqa: BLE001 - any failure is retried or dropped below
                if is_transient(exc):
                    log.warning(
                        "report %s not delivered (%s); retry in %.1fs", report, exc, backoff
                    )
                    with self._cond:
                        self._sending = False
                        self._cond.wait_for(lambda: self._stopping, timeout=backoff)
                    backoff = min(backoff * 2, self._max_backoff)
                    continue
                log.error("controller refused report %s: %s; dropping it", report, exc)
            backoff = self._initial_backoff
            with self._cond:
                if self._queue and self._queue[0] is report:
                    self._queue.popleft()
                self._sending = False
                self._cond.notify_all()
