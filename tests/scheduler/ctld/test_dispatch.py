"""Effect dispatch: launches go out one by one, events coalesce to the newest per job."""

from __future__ import annotations

import threading

from scheduler.core.effects import Emit, Launch, Signal
from scheduler.ctld.dispatch import Dispatcher, coalesce, task_for


class RecordingBroker:
    """Stands in for the Celery app's send_task: a third-party boundary."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.gate = threading.Event()

    def send_task(self, name, args, retry):
        self.gate.wait(5)
        self.sent.append((name, args[0]))


def emit(job_id: int, seq: int) -> Emit:
    return Emit(job_id, seq=seq, kind="k", at=1.0, job={"job_id": job_id, "seq": seq})


def test_coalescing_keeps_the_newest_event_of_each_job_in_seq_order():
    events = [emit(1, 1), emit(2, 2), emit(1, 3), emit(3, 4), emit(2, 5)]
    assert [(e.job_id, e.seq) for e in coalesce(events)] == [(1, 3), (3, 4), (2, 5)]


def test_launches_are_sent_before_the_events_queued_with_them():
    broker = RecordingBroker()
    broker.gate.set()
    dispatcher = Dispatcher(broker, cluster="c", kill_wait_s=5, signing_key=b"k")
    # Queued before the thread starts: its first pass takes all of them at once.
    dispatcher.submit([emit(9, 1), emit(1, 2), Launch(1, attempt=1, node="n", agent_url="u")])
    dispatcher.submit([emit(1, 3)])
    dispatcher.submit([Signal(2, attempt=1, node="n", agent_url="u", signal=15, escalate=True)])
    dispatcher.start()
    dispatcher.stop()
    names = [name for name, _ in broker.sent]
    assert names == ["spur.launch_job", "spur.signal_job", "spur.job_events"]
    assert [(e["job"]["job_id"], e["seq"]) for e in broker.sent[2][1]] == [(9, 1), (1, 3)]
    assert broker.sent[1][1]["kill_after_s"] == 5


def test_a_plain_signal_does_not_escalate():
    _, payload = task_for(
        Signal(2, attempt=1, node="n", agent_url="u", signal=10),
        cluster="c",
        kill_wait_s=5,
        signing_key=b"k",
        now=1000.0,
    )
    assert payload["kill_after_s"] is None and payload["signal"] == 10
    assert payload["signature"]["expires"] == 1000 + 1800
