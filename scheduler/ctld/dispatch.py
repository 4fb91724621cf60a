"""Effect dispatch: the leader turns committed effects into Celery tasks, by name.

The controller never imports the web app: tasks are sent by name (`spur.launch_jobs`,
`spur.signal_job`, `spur.job_events`) to the broker that the workers of `spurcloud`
consume. Sending happens on one background thread, in commit order, so the Raft thread
never waits for the broker; every task is idempotent at its receiver, so sending one
twice (after a leader change) is harmless.

Launches are batched per agent: the launches that queued up together (a scheduling pass
that placed several jobs) go out as one `spur.launch_jobs` task per node, in order, each
launch still signed on its own, and the worker delivers them in one request. A signal
waits for the launches queued before it, so it never overtakes them.

Job events only feed the history mirror, which keeps the newest `seq` of each job. So
the thread sends launches and signals at once, and the events at most every
`EVENTS_WINDOW_S` (`EVENTS_WINDOW_BUSY_S` after a task of `EVENTS_BUSY` events or more),
all that queued up meanwhile as one `spur.job_events` task holding the newest event of
each job: under a burst of submissions or of jobs ending, hundreds of
events become a few tasks, which do not crowd the launches out of the workers.

Task bodies are JSON, content type `application/json` (what every worker accepts as
"json"), encoded with orjson (`SERIALIZER`): kombu's encoder took 13 µs an event, a
tenth of the leader's CPU a submission under load; orjson takes under 1. A value orjson
does not encode is left to kombu's encoder.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

import orjson
from celery import Celery
from kombu import serialization
from kombu.utils import json as kombu_json
from kombu.utils.uuid import uuid

from scheduler import filequeue
from scheduler.core.effects import Effect, Emit, Launch, Signal
from scheduler.rpc import signatures

log = logging.getLogger(__name__)

LAUNCH_TASK = "spur.launch_jobs"  # args: [[launch payload, ...]], all for one node
SIGNAL_TASK = "spur.signal_job"
EVENTS_TASK = "spur.job_events"
# Launches in one task at most: a request stays far below the RPC kit's body limit (a
# launch carries its script), and a node's agent answers it in well under its timeout.
MAX_LAUNCH_BATCH = 32
# Events wait this long after the last events task for more to join them: under load
# (jobs ending one by one), hundreds of one-event tasks became the worker's main work, and
# launches waited behind them; the history and the portal see a change 0.1 s later (an
# event after a quiet spell goes at once).
EVENTS_WINDOW_S = 0.1
# After a task of this many events or more (a busy cluster), the window is this long: a
# job that lives a tenth of a second then has its events mirrored and metered in one task
# more often than in two (bench/e2e.py: the worker's CPU a job 1.4-1.5 ms with 0.1 s,
# 1.1-1.2 with 0.25 s). A lighter load keeps the short window: a tool that reads the
# history (sacct) right after the live queue (squeue) says a job started finds it there
# sooner.
EVENTS_BUSY = 8
EVENTS_WINDOW_BUSY_S = 0.25


SERIALIZER = "spur-json"


def encode_json(value: Any) -> str:
    """JSON as kombu's "json" serializer writes it, by orjson (module docstring)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # a type only kombu's encoder knows
        encoded: str = kombu_json.dumps(value)  # type: ignore[no-untyped-call]
        return encoded


def register_serializer() -> None:
    """`SERIALIZER`: encoded by `encode_json`, decoded as "json" (kombu's own decoder),
    with the same content type; replies still name "json"."""
    json_name = serialization.registry.type_to_name.get("application/json", "json")
    serialization.register(  # type: ignore[no-untyped-call]
        SERIALIZER,
        encode_json,
        kombu_json.loads,
        content_type="application/json",
        content_encoding="utf-8",
    )
    serialization.registry.type_to_name["application/json"] = json_name


def broker_app(broker_url: str, broker_folder: str, *, polling_interval: float = 0.02) -> Celery:
    filequeue.register()
    register_serializer()
    app = Celery("spurctld", broker=broker_url, set_as_current=False)
    options: dict[str, Any] = {}
    if broker_url.startswith("filesystem"):
        options = filequeue.transport_options(broker_folder, polling_interval=polling_interval)
    app.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_serializer=SERIALIZER,
        accept_content=["json"],
    )
    return app


def task_for(
    effect: Effect, *, cluster: str, kill_wait_s: float, signing_key: bytes, now: float
) -> tuple[str, dict[str, Any]]:
    """The task of a launch or signal, signed for its node (scheduler/rpc/signatures.py)."""
    credential = signatures.node_key(signing_key, effect_node(effect))
    expires = now + signatures.LAUNCH_TTL_S
    if isinstance(effect, Launch):
        payload: dict[str, Any] = {
            "cmd_id": effect.cmd_id,
            "job_id": effect.job_id,
            "attempt": effect.attempt,
            "node": effect.node,
            "agent_url": effect.agent_url,
            "cluster_name": cluster,
            "job": effect.job,
            "epoch": effect.epoch,
        }
        fields = signatures.launch_fields(payload)
        payload["signature"] = signatures.sign(credential, "launch", fields, expires=expires)
        return LAUNCH_TASK, payload
    if isinstance(effect, Signal):
        payload = {
            "cmd_id": effect.cmd_id,
            "job_id": effect.job_id,
            "attempt": effect.attempt,
            "node": effect.node,
            "agent_url": effect.agent_url,
            "signal": effect.signal,
            "kill_after_s": (
                (kill_wait_s if effect.grace_s is None else effect.grace_s)
                if effect.escalate
                else None
            ),
        }
        if effect.step_id is not None:
            payload["step_id"] = effect.step_id
        fields = signatures.signal_fields(payload, effect.job_id)
        payload["signature"] = signatures.sign(credential, "signal", fields, expires=expires)
        return SIGNAL_TASK, payload
    raise TypeError(f"no task for effect {effect!r}")


def effect_node(effect: Effect) -> str:
    node = getattr(effect, "node", "")
    if not isinstance(node, str) or not node:
        raise TypeError(f"no task for effect {effect!r}")
    return node


def event_payload(effect: Emit, *, cluster: str) -> dict[str, Any]:
    return {
        "cmd_id": effect.cmd_id,
        "seq": effect.seq,
        "cluster": cluster,
        "kind": effect.kind,
        "at": effect.at,
        "job": effect.job,
    }


def coalesce(events: list[Emit]) -> list[Emit]:
    """The newest event of each job, in seq order."""
    newest: dict[int, Emit] = {}
    for event in events:
        if event.job_id not in newest or newest[event.job_id].seq < event.seq:
            newest[event.job_id] = event
    return sorted(newest.values(), key=lambda e: e.seq)


class Dispatcher:
    def __init__(
        self,
        app: Celery,
        *,
        cluster: str,
        kill_wait_s: float,
        signing_key: bytes,
        events_window_s: float = EVENTS_WINDOW_S,
        busy_window_s: float = EVENTS_WINDOW_BUSY_S,
    ) -> None:
        self._app = app
        self._cluster = cluster
        self._kill_wait_s = kill_wait_s
        self._signing_key = signing_key
        self._events_window_s = events_window_s
        self._busy_window_s = max(events_window_s, busy_window_s)
        # One item per commit: the effects of a pass arrive together, to be batched.
        self._queue: queue.Queue[list[Effect] | None] = queue.Queue()
        # A commit's events alone (most submissions): they wait for the window anyway,
        # so they are left here without waking the thread, unless it holds no events
        # (it then sleeps until something comes: `_holding` is False).
        self._events_in: deque[Emit] = deque()
        self._holding = False
        self._thread = threading.Thread(target=self._run, name="dispatch", daemon=True)
        # The thread's producer, held from its first send on: acquiring one from the
        # app's pool for each task revived its channel each time, a fifth of a send.
        self._producer: Any = None
        # The tasks whose queue was declared on the producer's connection (the first
        # send of each): Celery declares it for every send, and each one, though kombu
        # remembers what the connection declared, binds a copy of the queue to the
        # channel and wraps the declaration in a retry policy first (a quarter of a
        # send). Forgotten with the producer: a new connection declares again.
        self._declared: set[str] = set()
        self.sent = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, effects: list[Effect]) -> None:
        """Called on the Raft thread, once a log entry: under a burst of submissions,
        hundreds of times a second, and each wake-up of this thread is a GIL hand-over
        the Raft thread then waits to get back."""
        if not effects:
            return
        if all(type(e) is Emit for e in effects):
            self._events_in.extend(effects)  # type: ignore[arg-type]
            if not self._holding:
                self._queue.put([])  # wake it: these start a window
            return
        self._queue.put(list(effects))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        events: list[Emit] = []
        events_sent = 0.0  # monotonic
        window = self._events_window_s  # the next one, by the last task's size
        while True:
            due = events_sent + window
            # Published before looking at `_events_in`: events left there after this
            # look find the flag down and wake the thread.
            self._holding = bool(events)
            held = events or self._events_in
            try:  # wait for effects, or until the events held back are due
                items = [
                    self._queue.get(timeout=max(0.0, due - time.monotonic()) if held else None)
                ]
            except queue.Empty:
                items = []
            while True:  # take whatever else is already waiting
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            while self._events_in:
                events.append(self._events_in.popleft())
            stopping = None in items
            effects = [effect for item in items if item is not None for effect in item]
            events += self._send_tasks(effects)
            if events and (stopping or time.monotonic() >= due):
                sent = self._send_events(events)
                window = self._busy_window_s if sent >= EVENTS_BUSY else self._events_window_s
                events = []
                events_sent = time.monotonic()
            if stopping:
                self._release_producer()
                return

    def _send_tasks(self, effects: list[Effect]) -> list[Emit]:
        """Send the launches (batched per node) and signals, in order; the events."""
        events: list[Emit] = []
        launches: dict[str, list[dict[str, Any]]] = {}  # by node, in order
        for effect in effects:
            if isinstance(effect, Emit):
                events.append(effect)
                continue
            name, payload = task_for(
                effect,
                cluster=self._cluster,
                kill_wait_s=self._kill_wait_s,
                signing_key=self._signing_key,
                now=time.time(),
            )
            if name == LAUNCH_TASK:
                launches.setdefault(payload["node"], []).append(payload)
                continue
            self._send_launches(launches)  # a signal never overtakes a launch
            log.info(
                "cmd %s: %s job %s attempt %s on %s",
                effect.cmd_id,
                name,
                effect.job_id,
                payload["attempt"],
                payload["node"],
            )
            self._send(name, payload)
        self._send_launches(launches)
        return events

    def _send_launches(self, launches: dict[str, list[dict[str, Any]]]) -> None:
        for node, batch in launches.items():
            for start in range(0, len(batch), MAX_LAUNCH_BATCH):
                task = batch[start : start + MAX_LAUNCH_BATCH]
                # One line a task, naming each launch (cmd, job.attempt): a record a
                # launch was an eighth of this thread's CPU under a stream of submissions.
                log.info(
                    "%s on %s: %s",
                    LAUNCH_TASK,
                    node,
                    _Launched(task),
                )
                self._send(LAUNCH_TASK, task)
        launches.clear()

    def _send_events(self, events: list[Emit]) -> int:
        """One task of the newest event of each job in `events`; how many it holds."""
        if not events:
            return 0
        payload = [event_payload(e, cluster=self._cluster) for e in coalesce(events)]
        self._send(EVENTS_TASK, payload)
        return len(payload)

    def _send(self, name: str, payload: Any) -> None:
        while True:
            try:
                if self._producer is None:
                    self._producer = self._app.producer_pool.acquire(block=True)
                self._publish(name, [payload], _summary(payload))
                self._declared.add(name)
                self.sent += 1
                return
            except Exception:  # the broker is down: keep order, try again
                log.exception("could not send %s; retrying in a second", name)
                self._release_producer()  # a fresh one, on a fresh connection
                time.sleep(1.0)

    def _publish(self, name: str, args: list[Any], argsrepr: str) -> None:
        """What `Celery.send_task` does for a task sent by name from outside a task,
        its result ignored: Celery routes it, makes its message and publishes it. Its
        own bookkeeping around those steps (looking the name up among the app's tasks,
        options for a parent task and for countdowns, expiry and time limits, a result
        object nobody reads) took half of a send."""
        amqp = self._app.amqp
        task_id = uuid()
        options = amqp.router.route({}, name, args, None, None)
        message = amqp.create_task_message(
            task_id,
            name,
            args,
            None,
            reply_to=self._app.thread_oid,
            create_sent_event=self._app.conf.task_send_sent_event,
            argsrepr=argsrepr,
            kwargsrepr="{}",
            # As the tasks say of themselves (send_task passes it on the same way).
            ignore_result=True,
        )
        if name in self._declared:  # Celery's own (its queue) the first time, none after
            options["declare"] = []
        # send_task hands its options on to the send too, which copies the ones it does
        # not know (the reprs) into the message's properties: the same message as ever.
        amqp.send_task_message(
            self._producer,
            name,
            message,
            retry=True,
            argsrepr=argsrepr,
            kwargsrepr="{}",
            **options,
        )

    def _release_producer(self) -> None:
        producer, self._producer = self._producer, None
        self._declared.clear()
        if producer is not None:
            try:
                producer.release()
            except Exception:  # its connection is gone already: nothing to give back
                log.debug("could not release the producer", exc_info=True)


class _Launched:
    """A launch task's jobs as its log line names them, written only if it is logged."""

    __slots__ = ("_task",)

    def __init__(self, task: list[dict[str, Any]]) -> None:
        self._task = task

    def __str__(self) -> str:
        return ", ".join(f"cmd {p['cmd_id']} job {p['job_id']}.{p['attempt']}" for p in self._task)


def _summary(payload: Any) -> str:
    """What a task's message says of its arguments (its `argsrepr` header, for a
    monitor's listing): Celery would write a bounded repr of the whole payload, scripts
    and job dicts included, which took as long as the rest of the send."""
    if isinstance(payload, list):
        return f"[[{len(payload)} item(s)]]"
    return f"[{{job_id: {payload.get('job_id')}}}]"
