"""Effect dispatch: the leader turns committed effects into Celery tasks, by name.

The controller never imports the web app: tasks are sent by name (`spur.launch_job`,
`spur.signal_job`, `spur.job_events`) to the broker that the workers of `spurcloud`
consume. Sending happens on one background thread, in commit order, so the Raft thread
never waits for the broker; every task is idempotent at its receiver, so sending one
twice (after a leader change) is harmless.

Job events only feed the history mirror, which keeps the newest `seq` of each job. So
the thread sends launches and signals first and one at a time, and all the events that
queued up meanwhile as one `spur.job_events` task holding the newest event of each job:
under a burst of submissions, hundreds of events become a few tasks, and a launch never
waits in the workers' queue behind them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from celery import Celery

from scheduler import filequeue
from scheduler.core.effects import Effect, Emit, Launch, Signal
from scheduler.rpc import signatures

log = logging.getLogger(__name__)

LAUNCH_TASK = "spur.launch_job"
SIGNAL_TASK = "spur.signal_job"
EVENTS_TASK = "spur.job_events"


def broker_app(broker_url: str, broker_folder: str, *, polling_interval: float = 0.02) -> Celery:
    filequeue.register()
    app = Celery("spurctld", broker=broker_url, set_as_current=False)
    options: dict[str, Any] = {}
    if broker_url.startswith("filesystem"):
        options = filequeue.transport_options(broker_folder, polling_interval=polling_interval)
    app.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
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
        self, app: Celery, *, cluster: str, kill_wait_s: float, signing_key: bytes
    ) -> None:
        self._app = app
        self._cluster = cluster
        self._kill_wait_s = kill_wait_s
        self._signing_key = signing_key
        self._queue: queue.Queue[Effect | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="dispatch", daemon=True)
        self.sent = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, effects: list[Effect]) -> None:
        for effect in effects:
            self._queue.put(effect)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:  # take whatever else is already waiting
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            events: list[Emit] = []
            for effect in batch:
                if effect is None:
                    self._send_events(events)
                    return
                if isinstance(effect, Emit):
                    events.append(effect)
                else:
                    name, payload = task_for(
                        effect,
                        cluster=self._cluster,
                        kill_wait_s=self._kill_wait_s,
                        signing_key=self._signing_key,
                        now=time.time(),
                    )
                    log.info(
                        "cmd %s: %s job %s attempt %s on %s",
                        effect.cmd_id,
                        name,
                        effect.job_id,
                        payload["attempt"],
                        payload["node"],
                    )
                    self._send(name, payload)
            self._send_events(events)

    def _send_events(self, events: list[Emit]) -> None:
        if events:
            payload = [event_payload(e, cluster=self._cluster) for e in coalesce(events)]
            self._send(EVENTS_TASK, payload)

    def _send(self, name: str, payload: Any) -> None:
        while True:
            try:
                self._app.send_task(name, args=[payload], retry=True)
                self.sent += 1
                return
            except Exception:  # the broker is down: keep order, try again
                log.exception("could not send %s; retrying in a second", name)
                time.sleep(1.0)
