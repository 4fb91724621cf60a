"""Effect dispatch: launches go out batched per node, in order, before the signals queued
after them; events coalesce to the newest per job."""

from __future__ import annotations

import threading
import time
import types

from scheduler.core.effects import Emit, Launch, Signal
from scheduler.ctld.dispatch import (
    EVENTS_BUSY,
    MAX_LAUNCH_BATCH,
    Dispatcher,
    coalesce,
    task_for,
)
from scheduler.rpc import signatures
from tests.fixtures.processes import wait_until


class RecordingBroker:
    """Stands in for the Celery app where the dispatcher publishes (its `amqp`: routing,
    the task's message, the send): a third-party boundary."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.gate = threading.Event()
        self.producer_pool = self
        self.acquired = 0
        self.declare: list[object] = []  # each send's `declare` option (None: Celery's)
        self.amqp = self.router = self
        self.thread_oid = "oid"
        self.conf = types.SimpleNamespace(task_send_sent_event=False)

    def acquire(self, block):  # the app's producer pool
        self.acquired += 1
        return RecordingProducer()

    def route(self, options, name, args, kwargs, task_type):
        return {"queue": "celery"}

    def create_task_message(self, task_id, name, args, kwargs, **options):
        assert options["ignore_result"] and options["kwargsrepr"] == "{}"
        return name, args

    def send_task_message(self, producer, name, message, retry, **options):
        assert isinstance(producer, RecordingProducer) and not producer.released
        assert message[0] == name and options["queue"] == "celery"
        self.gate.wait(5)
        self.sent.append((name, message[1][0]))
        self.declare.append(options.get("declare"))


class RecordingProducer:
    released = False

    def release(self):
        self.released = True


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
    assert names == ["spur.launch_jobs", "spur.signal_job", "spur.job_events"]
    assert [p["job_id"] for p in broker.sent[0][1]] == [1]  # a list: one node's launches
    assert [(e["job"]["job_id"], e["seq"]) for e in broker.sent[2][1]] == [(9, 1), (1, 3)]
    assert broker.sent[1][1]["kill_after_s"] == 5
    assert broker.acquired == 1  # one producer for every task the thread sent


def test_a_send_that_fails_is_retried_on_a_fresh_producer():
    broker = RecordingBroker()
    broker.gate.set()
    real_send = broker.send_task_message
    failures = []

    def flaky(producer, name, message, retry, **options):
        if not failures:
            failures.append(producer)
            raise ConnectionError("the broker is down")
        real_send(producer, name, message, retry, **options)

    broker.send_task_message = flaky
    dispatcher = Dispatcher(broker, cluster="c", kill_wait_s=5, signing_key=b"k")
    dispatcher.submit([Launch(1, attempt=1, node="n", agent_url="u")])
    dispatcher.start()
    dispatcher.stop()
    assert [p["job_id"] for _, payload in broker.sent for p in payload] == [1]
    assert failures[0].released and broker.acquired == 2


def test_a_tasks_queue_is_declared_by_its_first_send_on_each_producer():
    """Celery declares the queue of the first send of each task on a producer (None:
    its default); later sends declare nothing, until a failed send's fresh producer."""
    broker = RecordingBroker()
    broker.gate.set()
    real_send = broker.send_task_message
    calls = []

    def flaky(producer, name, message, retry, **options):
        calls.append(name)
        if len(calls) == 3:
            raise ConnectionError("the broker is down")
        real_send(producer, name, message, retry, **options)

    broker.send_task_message = flaky
    dispatcher = Dispatcher(broker, cluster="c", kill_wait_s=5, signing_key=b"k")
    for node in ("a", "a", "b"):  # one at a time: a task each
        dispatcher._send_tasks([Launch(1, attempt=1, node=node, agent_url="u")])
    dispatcher._send_tasks([Signal(2, attempt=1, node="n", agent_url="u", signal=15)])
    assert broker.declare == [None, [], None, None]
    assert broker.acquired == 2


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


def launch(job_id: int, node: str) -> Launch:
    return Launch(job_id, attempt=1, node=node, agent_url=f"http://{node}")


def test_a_pass_sends_one_task_per_node_with_its_launches_in_order():
    broker = RecordingBroker()
    broker.gate.set()
    dispatcher = Dispatcher(broker, cluster="c", kill_wait_s=5, signing_key=b"k")
    # One pass placed five jobs on two nodes; a later command cancels job 3.
    dispatcher.submit([launch(5, "a"), launch(3, "b"), launch(4, "a"), launch(1, "a")])
    dispatcher.submit([launch(2, "b")])
    dispatcher.submit([Signal(3, attempt=1, node="b", agent_url="http://b", signal=15)])
    dispatcher.submit([launch(6, "a")])
    dispatcher.start()
    dispatcher.stop()
    sent = [(name, payload) for name, payload in broker.sent]
    assert [name for name, _ in sent] == [
        "spur.launch_jobs",
        "spur.launch_jobs",
        "spur.signal_job",  # after the launch it signals, never before
        "spur.launch_jobs",
    ]
    assert [p["job_id"] for p in sent[0][1]] == [5, 4, 1]
    assert [p["job_id"] for p in sent[1][1]] == [3, 2]
    assert [p["job_id"] for p in sent[3][1]] == [6]
    for name, payloads in sent:
        for payload in payloads if name == "spur.launch_jobs" else []:
            # Each launch is signed on its own, for its node: the agent checks each.
            key = signatures.node_key(b"k", payload["node"])
            fields = signatures.launch_fields(payload)
            signatures.verify(key, "launch", fields, payload["signature"],
                              node=payload["node"], now=1.0)  # fmt: skip


def test_a_big_pass_is_cut_into_tasks_of_at_most_the_batch_size():
    broker = RecordingBroker()
    broker.gate.set()
    dispatcher = Dispatcher(broker, cluster="c", kill_wait_s=5, signing_key=b"k")
    dispatcher.submit([launch(i, "a") for i in range(1, MAX_LAUNCH_BATCH + 3)])
    dispatcher.start()
    dispatcher.stop()
    sizes = [len(payload) for _, payload in broker.sent]
    assert sizes == [MAX_LAUNCH_BATCH, 2]
    ids = [p["job_id"] for _, payload in broker.sent for p in payload]
    assert ids == list(range(1, MAX_LAUNCH_BATCH + 3))


def test_events_held_back_for_the_window_are_sent_without_more_effects():
    broker = RecordingBroker()
    broker.gate.set()
    dispatcher = Dispatcher(
        broker, cluster="c", kill_wait_s=5, signing_key=b"k", events_window_s=2.0
    )
    dispatcher.start()
    try:
        dispatcher.submit([emit(1, 1)])
        wait_until(lambda: len(broker.sent) == 1, timeout=5, what="the first events task")
        # Within the window after that send: held back, then sent though nothing follows.
        dispatcher.submit([emit(2, 2)])
        dispatcher.submit([emit(2, 3), launch(2, "a")])
        wait_until(lambda: len(broker.sent) == 3, timeout=10, what="the held-back events")
    finally:
        dispatcher.stop()
    assert [name for name, _ in broker.sent] == [
        "spur.job_events",
        "spur.launch_jobs",  # not held back with the events
        "spur.job_events",
    ]
    assert [(e["job"]["job_id"], e["seq"]) for e in broker.sent[2][1]] == [(2, 3)]


def test_after_a_busy_task_of_events_the_next_waits_the_longer_window():
    """A task of EVENTS_BUSY events or more (a busy cluster) is followed by the busy
    window; a small one by the short window."""
    broker = RecordingBroker()
    broker.gate.set()
    dispatcher = Dispatcher(
        broker, cluster="c", kill_wait_s=5, signing_key=b"k",
        events_window_s=0.3, busy_window_s=3.0,
    )  # fmt: skip
    dispatcher.start()
    try:
        dispatcher.submit([emit(job, job) for job in range(1, EVENTS_BUSY + 1)])
        wait_until(lambda: len(broker.sent) == 1, timeout=5, what="the busy task")
        busy_sent = time.monotonic()
        dispatcher.submit([emit(100, 100)])
        wait_until(lambda: len(broker.sent) == 2, timeout=10, what="the next task")
        after_busy = time.monotonic() - busy_sent
        small_sent = time.monotonic()
        dispatcher.submit([emit(101, 101)])
        wait_until(lambda: len(broker.sent) == 3, timeout=10, what="the one after")
        after_small = time.monotonic() - small_sent
    finally:
        dispatcher.stop()
    assert [len(payload) for _, payload in broker.sent] == [EVENTS_BUSY, 1, 1]
    assert after_busy >= 2.5
    assert after_small < 2.0


def test_events_of_many_commits_alone_all_go_out_in_order_of_seq():
    """A commit's events alone do not wake the thread while it holds events back: they
    go out with the window's task, none lost, the newest of each job."""
    broker = RecordingBroker()
    broker.gate.set()
    dispatcher = Dispatcher(
        broker, cluster="c", kill_wait_s=5, signing_key=b"k", events_window_s=0.2
    )
    dispatcher.start()
    try:
        for seq in range(1, 201):
            dispatcher.submit([emit(seq % 50, seq)])
        wait_until(
            lambda: (
                sum(len(p) for _, p in broker.sent) >= 50
                and {e["job"]["job_id"]: e["seq"] for _, p in broker.sent for e in p}
                == {j: 150 + (j or 50) for j in range(50)}
            ),
            timeout=10,
            what="every job's newest event",
        )
    finally:
        dispatcher.stop()
    assert {name for name, _ in broker.sent} == {"spur.job_events"}
    for _, payload in broker.sent:
        assert [e["seq"] for e in payload] == sorted(e["seq"] for e in payload)
