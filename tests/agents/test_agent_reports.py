"""Reports reach the controller in order, even when it is briefly away."""

from __future__ import annotations

import threading
from typing import Any

from agents.reports import ReportQueue
from scheduler.client import JobReport
from scheduler.rpc.errors import NotFound, Unavailable


class FlakyController:
    """Fails the first `failures` calls as unreachable, then acknowledges."""

    def __init__(self, failures: int = 0, refuse: set[int] | None = None) -> None:
        self.failures = failures
        self.refuse = refuse or set()
        self.calls = 0
        self.acknowledged: list[tuple[str, int, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def report(self, report: JobReport) -> None:
        with self.lock:
            self.calls += 1
            if self.failures:
                self.failures -= 1
                raise Unavailable("no controller reachable")
            if report.job_id in self.refuse:
                raise NotFound("no such job")
            self.acknowledged.append((report.kind, report.job_id, report.body()))


def started(job_id: int, pid: int) -> JobReport:
    return JobReport("started", job_id, 1, "n1", pid=pid)


def finished(job_id: int, exit_code: int, signal: int = 0) -> JobReport:
    return JobReport("finished", job_id, 1, "n1", exit_code=exit_code, signal=signal)


def test_reports_are_retried_until_acknowledged_and_keep_their_order() -> None:
    controller = FlakyController(failures=3)
    queue = ReportQueue(controller, initial_backoff_s=0.01, max_backoff_s=0.02).start()
    try:
        queue.report(started(1, pid=100))
        queue.report(finished(1, 0, signal=15))
        assert queue.flush(timeout=5)
    finally:
        queue.stop()
    assert controller.calls == 5
    assert [(k, j) for k, j, _ in controller.acknowledged] == [("started", 1), ("finished", 1)]
    assert controller.acknowledged[1][2]["signal"] == 15
    assert queue.pending() == 0


def test_a_report_the_controller_refuses_is_dropped_not_retried_forever() -> None:
    controller = FlakyController(refuse={2})
    queue = ReportQueue(controller, initial_backoff_s=0.01).start()
    try:
        queue.report(finished(2, 1))
        queue.report(finished(3, 0))
        assert queue.flush(timeout=5)
    finally:
        queue.stop()
    assert [j for _, j, _ in controller.acknowledged] == [3]


def test_reporting_never_blocks_the_caller_while_the_controller_is_down() -> None:
    controller = FlakyController(failures=10**6)
    queue = ReportQueue(controller, initial_backoff_s=10).start()
    try:
        queue.report(started(4, pid=1))
        assert queue.pending() == 1
        assert not queue.flush(timeout=0.1)
    finally:
        queue.stop(timeout=2)


def test_the_outbox_keeps_unsent_reports_for_the_next_agent_in_order(tmp_path) -> None:
    # The fault: reports lived in memory only, so an agent that stopped while the
    # controller was away lost a `finished`, and the job stayed RUNNING for ever.
    outbox = tmp_path / "outbox"
    down = FlakyController(failures=10**6)
    first = ReportQueue(down, outbox=outbox, initial_backoff_s=10).start()
    first.report(started(5, pid=50))
    first.report(finished(5, 0))
    first.report(started(6, pid=60))
    first.stop(timeout=2)
    assert len(list(outbox.glob("*.json"))) == 3
    # The agent starts again; the controller is back.
    up = FlakyController()
    again = ReportQueue(up, outbox=outbox, initial_backoff_s=0.01).start()
    try:
        again.report(finished(6, 3))
        assert again.flush(timeout=5)
    finally:
        again.stop()
    assert [(k, j) for k, j, _ in up.acknowledged] == [
        ("started", 5),
        ("finished", 5),
        ("started", 6),
        ("finished", 6),
    ]
    assert up.acknowledged[3][2]["exit_code"] == 3
    assert list(outbox.glob("*.json")) == []  # acknowledged: gone


def test_a_refused_report_leaves_the_outbox_too(tmp_path) -> None:
    controller = FlakyController(refuse={7})
    queue = ReportQueue(controller, outbox=tmp_path / "outbox", initial_backoff_s=0.01).start()
    try:
        queue.report(finished(7, 1))
        assert queue.flush(timeout=5)
    finally:
        queue.stop()
    assert list((tmp_path / "outbox").iterdir()) == []


def test_waking_the_queue_retries_at_once() -> None:
    controller = FlakyController(failures=1)
    queue = ReportQueue(controller, initial_backoff_s=30).start()
    try:
        queue.report(finished(8, 0))
        deadline = threading.Event()
        while controller.calls < 1:
            deadline.wait(0.01)
        assert not queue.flush(timeout=0.2)  # waiting out its 30 s backoff
        queue.wake()  # a heartbeat was acknowledged: the controller is reachable
        assert queue.flush(timeout=5)
    finally:
        queue.stop()


def test_ends_not_yet_acknowledged_are_named_until_they_are() -> None:
    controller = FlakyController(failures=10**6)  # a leader that does not answer
    queue = ReportQueue(controller, initial_backoff_s=0.01, max_backoff_s=0.01).start()
    try:
        queue.report(started(7, pid=70))
        queue.report(finished(7, exit_code=0))
        queue.report(finished(8, exit_code=3))
        # What the heartbeat lists beside the running jobs: the controller then waits
        # for these reports instead of ending the jobs as vanished.
        assert queue.unacknowledged_ends() == [(7, 1), (8, 1)]
        controller.failures = 0
        assert queue.flush(timeout=5)
        assert queue.unacknowledged_ends() == []
    finally:
        queue.stop()
