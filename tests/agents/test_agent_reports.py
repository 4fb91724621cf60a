"""Reports reach the controller in order, even when it is briefly away."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from agents.reports import ReportQueue, outbox_reports
from scheduler.client import MAX_REPORT_BATCH, ControllerClient, JobReport
from scheduler.rpc.errors import NotFound, Refused, Unavailable
from tests.fixtures.controller import RunningController
from tests.fixtures.processes import wait_until
from tests.scheduler.core.factories import gpu_node, spec


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
    assert [(r.kind, r.job_id) for r in outbox_reports(outbox)] == [
        ("started", 5),
        ("finished", 5),
        ("started", 6),
    ]
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
    assert outbox_reports(outbox) == []  # acknowledged: marked done


def test_a_refused_report_leaves_the_outbox_too(tmp_path) -> None:
    controller = FlakyController(refuse={7})
    queue = ReportQueue(controller, outbox=tmp_path / "outbox", initial_backoff_s=0.01).start()
    try:
        queue.report(finished(7, 1))
        assert queue.flush(timeout=5)
    finally:
        queue.stop()
    assert outbox_reports(tmp_path / "outbox") == []


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


# -- batches, against a real controller ---------------------------------------------------


def _running_jobs(client: ControllerClient, count: int) -> list[dict[str, Any]]:
    client.register_node(gpu_node("n1").to_dict())
    ids = [client.submit(spec(name=f"r{i}").to_dict())["job_id"] for i in range(count)]
    wait_until(
        lambda: all(client.job(i)["state"] == "RUNNING" for i in ids), timeout=30, what="running"
    )
    return [client.job(i) for i in ids]


def _log_index(client: ControllerClient) -> int:
    return int(client.raft()["log_last_index"])


def test_queued_reports_go_out_together_in_order_each_answered_on_its_own(
    controller: RunningController, tmp_path: Path
) -> None:
    """What the queue holds goes out as one request, committed as one log entry in
    order (a job's `finished` after its `started`), and a report the controller refuses
    (malformed: a negative pid) is dropped without refusing its neighbours."""
    with controller.client() as client:
        one, two = _running_jobs(client, 2)
        a1, a2 = one["attempt"], two["attempt"]
        queue = ReportQueue(client, outbox=tmp_path / "outbox", initial_backoff_s=0.01)
        queue.report(JobReport("started", one["job_id"], a1, "n1", pid=101))
        queue.report(JobReport("finished", one["job_id"], a1, "n1", exit_code=3))
        queue.report(JobReport("started", two["job_id"], a2, "n1", pid=-1))  # refused
        queue.report(JobReport("started", two["job_id"], a2, "n1", pid=202))
        before = _log_index(client)
        queue.start()
        try:
            assert queue.flush(timeout=10)
        finally:
            queue.stop()
        assert _log_index(client) == before + 1  # one log entry: one batch
        first, second = client.job(one["job_id"]), client.job(two["job_id"])
        # `started` applied before `finished`: its pid is kept, and the exit code recorded.
        assert (first["state"], first["pid"], first["exit_code"]) == ("FAILED", 101, 3)
        assert (second["state"], second["pid"]) == ("RUNNING", 202)
    assert outbox_reports(tmp_path / "outbox") == []  # all answered: none kept


def test_the_controller_answers_each_report_of_a_batch_on_its_own(
    controller: RunningController,
) -> None:
    with controller.client() as client:
        (job,) = _running_jobs(client, 1)
        stale = JobReport("finished", job["job_id"], job["attempt"] + 5, "n1", exit_code=1)
        bad = JobReport("finished", job["job_id"], job["attempt"], "n" * 300, exit_code=0)
        good = JobReport("finished", job["job_id"], job["attempt"], "n1", exit_code=0)
        answers = client.report_all([stale, bad, good])
        # The stale one is taken and ignored (reports are idempotent by job and attempt),
        # the malformed one is refused alone, the last one ends the job.
        assert answers[0] is None and answers[2] is None
        assert isinstance(answers[1], Refused) and "reports[1]" in str(answers[1])
        assert client.job(job["job_id"])["state"] == "COMPLETED"
        with pytest.raises(Refused):
            client.call("POST", "/v1/reports", json={"reports": []})
        with pytest.raises(Refused):
            client.call("POST", "/v1/reports", json={"reports": [{}] * (MAX_REPORT_BATCH + 1)})


# -- the outbox's journal, and the pace of requests ----------------------------------------


class RecordingBatches:
    """A batch sink that records what each request carried."""

    def __init__(self) -> None:
        self.requests: list[list[tuple[str, int]]] = []
        self.lock = threading.Lock()

    def report(self, report: JobReport) -> None:
        self.report_all([report])

    def report_all(self, reports: Any) -> list[Any]:
        with self.lock:
            self.requests.append([(r.kind, r.job_id) for r in reports])
        return [None for _ in reports]


def test_reports_an_agent_of_an_earlier_version_left_as_files_are_sent_first(
    tmp_path: Path,
) -> None:
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    for n, report in enumerate([started(1, pid=10), finished(1, 0)]):
        (outbox / f"{n:012d}.1.1.{report.kind}.json").write_text(json.dumps(report.to_dict()))
    sink = RecordingBatches()
    queue = ReportQueue(sink, outbox=outbox).start()
    try:
        queue.report(started(2, pid=20))
        assert queue.flush(timeout=5)
    finally:
        queue.stop()
    sent = [r for request in sink.requests for r in request]
    assert sent == [("started", 1), ("finished", 1), ("started", 2)]
    assert list(outbox.glob("*.json")) == [] and outbox_reports(outbox) == []


def test_a_journal_line_cut_short_by_a_dying_agent_is_skipped(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    down = FlakyController(failures=10**6)
    first = ReportQueue(down, outbox=outbox, initial_backoff_s=10).start()
    first.report(started(3, pid=30))
    first.report(finished(3, 1))
    first.stop(timeout=2)
    journal = outbox / "journal"
    journal.write_bytes(journal.read_bytes()[:-7])  # the last line, torn
    assert [(r.kind, r.job_id) for r in outbox_reports(outbox)] == [("started", 3)]


def test_under_load_a_request_carries_what_came_meanwhile(tmp_path: Path) -> None:
    sink = RecordingBatches()
    queue = ReportQueue(sink, outbox=tmp_path / "outbox", interval_s=0.2).start()
    try:
        queue.report(started(1, pid=10))  # after a quiet spell: at once
        wait_until(lambda: len(sink.requests) == 1, timeout=5, what="the first request")
        for job_id in (2, 3):
            queue.report(started(job_id, pid=job_id))
            queue.report(finished(job_id, 0))
        assert queue.flush(timeout=5)
    finally:
        queue.stop()
    assert sink.requests == [
        [("started", 1)],
        [("started", 2), ("finished", 2), ("started", 3), ("finished", 3)],
    ]


def test_a_journal_grown_large_starts_again_once_nothing_is_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agents.reports.COMPACT_BYTES", 1000)
    outbox = tmp_path / "outbox"
    queue = ReportQueue(RecordingBatches(), outbox=outbox, interval_s=0).start()
    try:
        for job_id in range(20):
            queue.report(finished(job_id, 0))
            assert queue.flush(timeout=5)
        assert (outbox / "journal").stat().st_size < 1000 + 200
    finally:
        queue.stop()
    assert outbox_reports(outbox) == []
