"""Celery tasks the controller sends by name (docs/architecture.md, "Celery tasks").

They take plain dicts, are idempotent (launch is keyed by (job_id, attempt) at the agent,
events by seq here), and stay thin: one service or one agent call each (a node's
launches that the controller batched go in one call)."""

from __future__ import annotations

import logging
import threading
from typing import Any, NoReturn

from celery import Task, shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from scheduler.rpc.errors import RpcError, Unavailable
from spurcloud.billing.metering import meter_job_events
from spurcloud.jobs.live import push_jobs
from spurcloud.jobs.services import job_records, record_job_events

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0


def backoff_s(retries: int) -> float:
    """0.5 s, 1 s, 2 s, ... capped at a minute: an agent that restarts is back in seconds,
    one that is down for good has the controller's node liveness to deal with it."""
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2**retries)))


# Celery ships no types: its task decorator is unannotated, hence the ignores below.
@shared_task(  # type: ignore[untyped-decorator]
    name="spur.job_events",
    ignore_result=True,
    trace_at_debug=True,  # one or more a job: Celery's per-task lines at DEBUG (celery.py)
    # A database that is briefly away must not lose the events: the history would stay
    # stale until the job's next change (and a finished job has none).
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,  # seconds, doubled each time (with jitter)
    retry_backoff_max=int(BACKOFF_MAX_S),
    max_retries=settings.SPUR_AGENT_MAX_RETRIES,
)
def job_events(events: list[dict[str, Any]]) -> int:
    """Mirrors a batch of job events (the controller coalesces them, newest per job),
    meters them into billing, and pushes each job they changed to the portal. Returns
    how many records changed."""
    changed = record_job_events(events=events)
    # An in-memory channel layer lives in one process: from a worker its messages reach
    # nobody (the web's consumers poll the history instead; see settings), so the
    # changed records are not even read.
    push = not settings.CHANNEL_LAYER_IN_MEMORY
    records = job_records(job_ids=changed) if push else []
    # Idempotent by (job, attempt) and how far each run is charged: a retried batch
    # charges nothing twice (spurcloud/billing/metering.py).
    meter_job_events(events=events)
    if push:
        push_jobs(records)
    return len(changed)


_agents_lock = threading.Lock()
_agents: dict[tuple[str, str, float], Any] = {}


def agent_client(url: str) -> Any:
    """One client per agent per worker process, shared by its threads: a new httpx client
    costs a TLS context and a TCP connection, more than the launch call itself."""
    # Imported here: agents/ is its own package, and the web process, which shares this
    # module through autodiscovery, never calls an agent.
    from agents.client import AgentClient

    key = (url, settings.SPUR_CLUSTER_TOKEN, float(settings.SPUR_AGENT_TIMEOUT_S))
    with _agents_lock:
        client = _agents.get(key)
        if client is None:
            client = _agents[key] = AgentClient(url, key[1], timeout=key[2])
        return client


def _call_agent(task: Task, arg: Any, what: str, call: Any) -> Any:
    """`call(the agent's client)`; `arg`: what the task carries (a payload, or a list of
    them for one agent), retried whole when the agent does not answer."""
    payload = arg[0] if isinstance(arg, list) else arg
    try:
        return call(agent_client(payload["agent_url"]))
    except Unavailable as exc:
        _retry(task, arg, what, exc)
    except RpcError as exc:
        # A refusal is an answer: retrying would be refused again.
        log.error(
            "job %s (cmd %s): agent %s refused %s: %s",
            payload.get("job_id"),
            payload.get("cmd_id"),
            payload.get("agent_url"),
            what,
            exc,
        )
        return None


def _retry(task: Task, arg: Any, what: str, exc: Unavailable) -> NoReturn:
    """Retry the task on `arg` (all it carried, or what of it is left) with backoff, or
    give up once the retries ran out."""
    first = arg[0] if isinstance(arg, list) else arg
    if task.request.retries >= task.max_retries:
        log.error(
            "job %s: %s gave up on %s: %s",
            first.get("job_id"),
            what,
            first.get("agent_url"),
            exc,
        )
        raise exc
    raise task.retry(args=[arg], exc=exc, countdown=backoff_s(task.request.retries)) from exc


@shared_task(  # type: ignore[untyped-decorator]
    name="spur.launch_jobs",
    bind=True,
    max_retries=settings.SPUR_AGENT_MAX_RETRIES,
    ignore_result=True,
    trace_at_debug=True,  # one a job (and each launch in it logged by the controller)
)
def launch_jobs(self: Task, payloads: list[dict[str, Any]]) -> Any:
    """Asks one agent to launch several jobs, in order, in one request (the controller
    batches a pass's launches per node; each is idempotent by (job_id, attempt)). A launch
    the agent refused is logged and dropped; one it could not start now (503), or all of
    them when it did not answer, are retried with backoff. Returns the agent's results."""
    if not payloads:
        return []
    for payload in payloads:
        # At DEBUG: the controller logs each launch it sends at INFO (job, attempt, node,
        # cmd); here, what the agent refused or did not answer is logged below.
        log.debug(
            "job %s (cmd %s): launch attempt %s on %s",
            payload.get("job_id"),
            payload.get("cmd_id"),
            payload.get("attempt"),
            payload.get("node"),
        )
    results = _call_agent(self, payloads, "launch", lambda agent: agent.launch_all(payloads))
    if results is None:  # the whole request was refused (logged)
        return None
    again = []
    for payload, result in zip(payloads, results, strict=True):
        error = result.get("error")
        if error is None:
            continue
        if int(error.get("status", 0)) >= 500:
            again.append(payload)
            continue
        log.error(
            "job %s (cmd %s): agent %s refused launch: %s",
            payload.get("job_id"),
            payload.get("cmd_id"),
            payload.get("agent_url"),
            error.get("detail"),
        )
    if again:
        _retry(self, again, "launch", Unavailable(f"{len(again)} launch(es) not started yet"))
    return results


@shared_task(  # type: ignore[untyped-decorator]
    name="spur.signal_job",
    bind=True,
    max_retries=settings.SPUR_AGENT_MAX_RETRIES,
    ignore_result=True,
)
def signal_job(self: Task, payload: dict[str, Any]) -> Any:
    """Asks the job's agent to signal it (and kill it after `kill_after_s`, if given)."""
    return _call_agent(
        self,
        payload,
        "signal",
        lambda agent: agent.signal(
            int(payload["job_id"]),
            attempt=int(payload["attempt"]),
            signal=int(payload["signal"]),
            kill_after_s=payload.get("kill_after_s"),
            signature=payload.get("signature"),
            step_id=payload.get("step_id"),
        ),
    )
