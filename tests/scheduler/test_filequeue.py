"""The embedded file-system broker: whole messages only, shared by controller and worker."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

import orjson
import pytest
from kombu import Connection

from scheduler import filequeue
from scheduler.ctld.dispatch import broker_app


def test_a_task_sent_by_the_controller_is_read_whole_by_a_consumer(tmp_path):
    app = broker_app("filesystem://", str(tmp_path))
    payload = {"job_id": 7, "script": "x" * 200_000}
    app.send_task("spur.job_event", args=[payload])
    assert [p.name for p in (tmp_path / filequeue.INCOMING).iterdir()] == []
    options = filequeue.transport_options(tmp_path, polling_interval=0.01)
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        message = queue.get(timeout=5)
        assert message.headers["task"] == "spur.job_event"
        assert message.decode()[0] == [payload]
        message.ack()
        queue.close()


def test_concurrent_writers_never_expose_a_partial_message(tmp_path):
    app = broker_app("filesystem://", str(tmp_path))
    options = filequeue.transport_options(tmp_path, polling_interval=0.001)
    sent = 200

    def produce() -> None:
        for i in range(sent // 2):
            app.send_task("spur.job_event", args=[{"i": i, "pad": "y" * 50_000}])

    writers = [threading.Thread(target=produce) for _ in range(2)]
    for w in writers:
        w.start()
    received = 0
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        while received < sent:
            message = queue.get(timeout=10)
            assert message.decode()[0][0]["pad"] == "y" * 50_000
            message.ack()
            received += 1
        queue.close()
    for w in writers:
        w.join()
    assert received == sent


def test_a_task_body_is_plain_json_that_any_worker_accepts(tmp_path):
    """orjson encodes the controller's tasks: still content type application/json (the
    workers' "json"), read back as sent, text beyond ASCII included."""
    app = broker_app("filesystem://", str(tmp_path))
    payload = {"job_id": 7, "name": "réseau ✓", "gpus": (1, 2), "at": 1.5, "none": None}
    app.send_task("spur.job_event", args=[payload])
    options = filequeue.transport_options(tmp_path, polling_interval=0.01)
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        message = queue.get(timeout=5)
        assert message.content_type == "application/json"
        assert json.loads(message.body)[0] == [{**payload, "gpus": [1, 2]}]
        message.ack()
        queue.close()


def test_a_burst_is_taken_from_one_listing_of_the_folder(tmp_path, monkeypatch):
    app = broker_app("filesystem://", str(tmp_path))
    for i in range(50):
        app.send_task("spur.job_event", args=[{"i": i}])
    listings = []
    listdir = filequeue.os.listdir

    def counted(path):
        listings.append(path)
        return listdir(path)

    monkeypatch.setattr(filequeue.os, "listdir", counted)
    # In the order sent, though many shared a millisecond.
    assert _taken(tmp_path, 50) == list(range(50))
    assert len(listings) <= 3  # not one a message


def test_messages_keep_their_order_when_the_clock_gains_a_digit(tmp_path, monkeypatch):
    app = broker_app("filesystem://", str(tmp_path))
    for i, now in enumerate((9.998, 9.999, 10.0, 10.001)):
        monkeypatch.setattr(filequeue, "monotonic", lambda now=now: now)
        app.send_task("spur.job_event", args=[{"i": i}])
    assert _taken(tmp_path, 4) == [0, 1, 2, 3]


def _taken(folder, count: int) -> list[int]:
    """The "i" of the first `count` messages in the folder's queue, in the order read."""
    options = filequeue.transport_options(folder, polling_interval=0.01)
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        got = []
        for _ in range(count):
            message = queue.get(timeout=5)
            got.append(message.decode()[0][0]["i"])
            message.ack()
        queue.close()
    return got


def test_two_consumers_never_take_the_same_message(tmp_path):
    app = broker_app("filesystem://", str(tmp_path))
    sent = 200
    for i in range(sent):
        app.send_task("spur.job_event", args=[{"i": i}])
    options = filequeue.transport_options(tmp_path, polling_interval=0.001)
    taken: list[list[int]] = [[], []]

    def consume(mine: list[int]) -> None:
        with Connection("filesystem://", transport_options=options) as conn:
            queue = conn.SimpleQueue("celery")
            while True:
                try:
                    message = queue.get(timeout=0.5)
                except queue.Empty:
                    break
                mine.append(message.decode()[0][0]["i"])
                message.ack()
            queue.close()

    threads = [threading.Thread(target=consume, args=(mine,)) for mine in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken[0] + taken[1]) == list(range(sent))
    assert list((tmp_path / filequeue.CLAIMED).iterdir()) == []


def test_the_dispatcher_sends_its_tasks_whole_on_the_broker(tmp_path):
    """The controller's dispatch thread, on the real app and broker: each task arrives
    whole and in order, its header naming the arguments in a few words (not a repr of
    the scripts)."""
    from scheduler.core.effects import Launch
    from scheduler.ctld.dispatch import LAUNCH_TASK, Dispatcher

    app = broker_app("filesystem://", str(tmp_path))
    dispatcher = Dispatcher(app, cluster="c", kill_wait_s=5, signing_key=b"k")
    job = {"job_id": 1, "spec": {"script": "#!/bin/sh\n" + "true\n" * 1000}}
    dispatcher.start()
    for node in ("n1", "n2"):
        dispatcher.submit([Launch(1, attempt=1, node=node, agent_url="u", job=job)])
    dispatcher.stop()
    options = filequeue.transport_options(tmp_path, polling_interval=0.01)
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        for node in ("n1", "n2"):
            message = queue.get(timeout=5)
            assert message.headers["task"] == LAUNCH_TASK
            assert message.headers["argsrepr"] == "[[1 item(s)]]"
            [launches] = message.decode()[0]
            assert [(p["node"], p["job"]) for p in launches] == [(node, job)]
            message.ack()
        queue.close()


def test_the_dispatcher_publishes_the_message_that_celerys_send_task_makes(tmp_path):
    """`Dispatcher._publish` takes Celery's steps without send_task around them: the
    same headers, properties and body, but for the ids each message has of its own."""
    from scheduler.ctld.dispatch import LAUNCH_TASK, Dispatcher

    app = broker_app("filesystem://", str(tmp_path))
    dispatcher = Dispatcher(app, cluster="c", kill_wait_s=5, signing_key=b"k")
    payload = [{"job_id": 1, "node": "n1"}]
    app.send_task(
        LAUNCH_TASK,
        args=[payload],
        argsrepr="[[1 item(s)]]",
        kwargsrepr="{}",
        ignore_result=True,
    )
    dispatcher._send(LAUNCH_TASK, payload)
    options = filequeue.transport_options(tmp_path, polling_interval=0.01)
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        sent = []
        for _ in range(2):
            message = queue.get(timeout=5)
            message.ack()
            headers = {k: v for k, v in message.headers.items() if k not in ("id", "root_id")}
            properties = {
                k: v
                for k, v in message.properties.items()
                if k not in ("correlation_id", "delivery_tag")
            }
            sent.append((headers, properties, message.body))
        queue.close()
    assert sent[0] == sent[1]


def test_a_read_message_leaves_an_empty_file_that_the_next_message_is_written_into(tmp_path):
    app = broker_app("filesystem://", str(tmp_path))
    options = filequeue.transport_options(tmp_path, polling_interval=0.01)
    spare = tmp_path / filequeue.SPARE
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        app.send_task("spur.job_event", args=[{"n": 1, "pad": "z" * 10_000}])
        queue.get(timeout=5).ack()
        [left] = list(spare.iterdir())
        assert left.stat().st_size == 0  # no message kept once read
        inode = left.stat().st_ino
        app.send_task("spur.job_event", args=[{"n": 2}])
        assert list(spare.iterdir()) == []
        [waiting] = [p for p in tmp_path.iterdir() if p.name.endswith(".msg")]
        assert waiting.stat().st_ino == inode
        message = queue.get(timeout=5)
        assert message.decode()[0] == [{"n": 2}]  # nothing of the longer message before
        message.ack()
        queue.close()


def test_what_orjson_would_misread_is_read_by_kombus_decoder(tmp_path):
    """A message that orjson refused to write (kombu's encoder wrote it) reads back as
    sent: a Decimal (kombu's "__type__" mark), an integer beyond 64 bits (orjson would
    read a float)."""
    filequeue.register()
    options = filequeue.transport_options(tmp_path, polling_interval=0.01)
    with Connection("filesystem://", transport_options=options) as conn:
        queue = conn.SimpleQueue("celery")
        for headers in ({"price": Decimal("1.25")}, {"big": 2**70, "small": -(2**63)}):
            # As Celery sends: by the default exchange, straight to the queue.
            conn.Producer().publish(
                {"ok": 1}, routing_key="celery", headers=headers, serializer="json"
            )
            message = queue.get(timeout=5)
            got = {name: message.headers.get(name) for name in headers}
            assert got == headers
            assert [type(v) for v in got.values()] == [type(v) for v in headers.values()]
            assert message.decode() == {"ok": 1}
            message.ack()
        queue.close()


def test_a_message_is_decoded_by_the_decoder_of_its_encoder():
    """orjson's output by orjson, kombu's encoder's by kombu's decoder (which alone reads
    its marks and integers beyond 64 bits back as written)."""
    message = {"headers": {"n": 2**63 - 1, "s": "a: b"}, "body": "e30="}
    assert filequeue._decode(filequeue._encode(message)) == message
    assert filequeue._encode(message).startswith(b'{"headers":{')
    marked = {"headers": {"price": Decimal("1.25"), "big": 2**64}, "body": ""}
    assert filequeue._decode(filequeue._encode(marked)) == marked
    # What orjson wrote is read as written, a "__type__" key among its data included.
    plain = {"headers": {"x": {"__type__": "decimal", "__value__": "1"}}}
    assert filequeue._decode(orjson.dumps(plain)) == plain
    with pytest.raises(ValueError):
        filequeue._decode(b'{"cut":')
    with pytest.raises(ValueError):
        filequeue._decode(b"[")


def test_a_message_written_over_a_longer_file_keeps_nothing_of_it(tmp_path):
    """A spare is empty; were one not, the message written into it is all it holds."""
    path = tmp_path / "m"
    path.write_bytes(b"x" * 5000)
    filequeue._write(str(path), b'{"n": 1}')
    assert path.read_bytes() == b'{"n": 1}'
    filequeue._write(str(tmp_path / "new"), b"{}")
    assert (tmp_path / "new").read_bytes() == b"{}"


@pytest.mark.parametrize("size", [0, 1, filequeue.READ_SIZE, 2 * filequeue.READ_SIZE + 3])
def test_a_message_file_is_read_whole_and_left_empty(tmp_path, size):
    path = tmp_path / "m"
    body = bytes(i % 251 for i in range(size))
    path.write_bytes(body)
    assert filequeue._read_and_empty(str(path)) == body
    assert path.stat().st_size == 0
