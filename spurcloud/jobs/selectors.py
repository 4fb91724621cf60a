"""Reads of jobs and of the cluster: the history, the live queue, nodes and partitions, a
job's output. Every read of jobs is scoped to one organisation; nodes are shown to
tenants without what only operators need."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils import timezone

from scheduler.core.arrays import parse_array, task_ids
from scheduler.core.errors import Rejected
from scheduler.rpc.errors import NotFound, RpcError, Unavailable
from spurcloud.jobs import jobobject
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.errors import JobOutputUnavailable, job_not_found_message
from spurcloud.jobs.models import ACTIVE_STATES, HistoryVersion, JobRecord
from spurcloud.tenants.models import Organization


def access_job(*, organization: Organization, job_id: int) -> JobRecord:
    """The organisation's job; the same 404 whether it is missing or someone else's."""
    record = JobRecord.objects.filter(organization=organization, job_id=job_id).first()
    if record is None:
        raise Http404(job_not_found_message(job_id))
    return record


def access_job_or_task(*, organization: Organization, job_id: int) -> JobRecord:
    """`access_job`, or a task of one of the organisation's arrays still in its pending
    remainder: the history keeps one row for the remainder (`array_tasks`, as sacct
    shows it), not one per task, until the task leaves it. That task is read off the
    remainder's row (the nearest below it), as an unsaved record of the same owner, so
    that who may act on it can be checked; the same 404 otherwise."""
    record = JobRecord.objects.filter(organization=organization, job_id=job_id).first()
    if record is not None:
        return record
    rest = (
        JobRecord.objects.filter(organization=organization, job_id__lt=job_id)
        .exclude(array_tasks="")
        .order_by("-job_id")
        .first()
    )
    task = None if rest is None else _remainder_task(rest, job_id)
    if rest is None or task is None:
        raise Http404(job_not_found_message(job_id))
    return JobRecord(
        cluster=rest.cluster,
        job_id=job_id,
        organization=organization,
        user=rest.user,
        name=rest.name,
        state=rest.state,
        array_job_id=rest.array_job_id,
        array_task_id=task,
        spec=rest.spec,
    )


def _remainder_task(rest: JobRecord, job_id: int) -> int | None:
    """The task id `job_id` has in the remainder `rest`, or None if it is not one of its:
    an array's task at position p of its task ids has job id `array_job_id + p`."""
    try:
        ids = task_ids(str((rest.spec or {}).get("array") or ""))
        pending = parse_array(rest.array_tasks)[0]
    except Rejected:
        return None
    position = job_id - (rest.array_job_id or 0)
    if rest.array_job_id is None or not 0 <= position < len(ids):
        return None
    return ids[position] if ids[position] in pending else None


def history_version(organization: Organization) -> int:
    """The organisation's history version (`HistoryVersion`): read it before the rows it
    is to stand for. 0 while it has no history."""
    version = (
        HistoryVersion.objects.filter(organization_id=organization.pk)
        .values_list("version", flat=True)
        .first()
    )
    return 0 if version is None else int(version)


def job_history(
    *,
    organization: Organization,
    ids: Iterable[int] | None = None,
    states: Iterable[str] | None = None,
    name: str | None = None,
    user: str | Iterable[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    accounts: Iterable[str] | None = None,
    partitions: Iterable[str] | None = None,
) -> QuerySet[JobRecord]:
    """The organisation's jobs, filtered as sacct filters: `since`/`until` select jobs that
    were not over before `since` and had been submitted by `until`; `user` is one name or
    several (any of them)."""
    jobs = JobRecord.objects.filter(organization=organization)
    if accounts:
        jobs = jobs.filter(account__in=list(accounts))
    if partitions:
        jobs = jobs.filter(partition__in=list(partitions))
    if ids:
        wanted = list(ids)
        # An array job id names all of its tasks, as in sacct -j.
        jobs = jobs.filter(Q(job_id__in=wanted) | Q(array_job_id__in=wanted))
    if states:
        jobs = jobs.filter(state__in=list(states))
    if name:
        jobs = jobs.filter(name=name)
    if isinstance(user, str):
        user = [user] if user else None
    if user:
        jobs = jobs.filter(user__in=list(user))
    if since is not None:
        jobs = jobs.exclude(end_time__lt=since)
    if until is not None:
        jobs = jobs.filter(submit_time__lte=until)
    return jobs


def jobs_changed_since(*, organization_id: int, seq: int, limit: int = 500) -> list[JobRecord]:
    """Rows updated by events after `seq`, oldest first (the live dashboard's poll)."""
    return list(
        JobRecord.objects.filter(organization_id=organization_id, last_seq__gt=seq)
        .select_related("organization")
        .order_by("last_seq")[:limit]
    )


# -- live reads from the controller (ControllerUnavailable passes through: 503) ------------


def live_queue(
    *,
    organization: Organization,
    states: Iterable[str] | None = None,
    user: str | Iterable[str] | None = None,
    ids: Iterable[int] | None = None,
    ended_window_s: float | None = None,
    now: datetime | None = None,
    names: Iterable[str] | None = None,
    accounts: Iterable[str] | None = None,
    partitions: Iterable[str] | None = None,
    fields: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The organisation's jobs as the controller has them now (what squeue reads): active
    ones, and those that ended within `ended_window_s` (SPUR_QUEUE_ENDED_WINDOW_S), as job
    objects, in job id order, cut to `fields` where given. Each filter given keeps the
    jobs that match any of its values; an id names a job, or every task of the array job
    it is (as squeue -j). The controller applies them all, so that only the rows and
    fields asked for travel."""
    filters = _queue_filters(
        organization, states, user, ids, ended_window_s, now, names, accounts, partitions
    )
    jobs = controller_client().jobs(**filters, fields=fields)
    return [jobobject.from_controller(job) for job in jobs]


def live_queue_columns(
    *,
    organization: Organization,
    fields: Sequence[str],
    states: Iterable[str] | None = None,
    user: str | Iterable[str] | None = None,
    ids: Iterable[int] | None = None,
    names: Iterable[str] | None = None,
    accounts: Iterable[str] | None = None,
    partitions: Iterable[str] | None = None,
    runs: bool = False,
) -> bytes:
    """The same jobs (`live_queue`) as the controller's columns answer (in runs where
    `runs`: `contract.runs`), the JSON text as it came (`contract.job_object.to_columns`:
    times in epoch seconds): the controller chose the organisation's jobs and cut them to
    `fields`, so there is nothing to read, convert or encode again here."""
    filters = _queue_filters(
        organization, states, user, ids, None, None, names, accounts, partitions
    )
    return controller_client().job_columns(**filters, fields=fields, runs=runs)


def _queue_filters(
    organization: Organization,
    states: Iterable[str] | None,
    user: str | Iterable[str] | None,
    ids: Iterable[int] | None,
    ended_window_s: float | None,
    now: datetime | None,
    names: Iterable[str] | None,
    accounts: Iterable[str] | None,
    partitions: Iterable[str] | None,
) -> dict[str, Any]:
    """The controller's filters for the organisation's live queue: always its tenant,
    and the window on ended jobs."""
    window = settings.SPUR_QUEUE_ENDED_WINDOW_S if ended_window_s is None else ended_window_s
    users = [user] if isinstance(user, str) else list(user or ())
    horizon = (now or timezone.now()).timestamp() - window
    return {
        "tenant": organization.slug,
        "states": list(states or ()),
        "ids": list(ids or ()),
        "users": [u for u in users if u],
        "names": list(names or ()),
        "accounts": list(accounts or ()),
        "partitions": list(partitions or ()),
        "ended_after": max(horizon, 0.0) if math.isfinite(horizon) else None,  # None: all
    }


# What a tenant sees of a node (the API's NodeSerializer says the same): its size, GPU
# models, partitions, state and how much of it is allocated. Not how to reach its agent
# (agent_url), its hardware's addresses and layout (PCIe, UUIDs, links, NUMA, labels), nor
# which devices other jobs hold (gpus_in_use, gpu_milli_used): an allow-list, so that a
# key the controller adds later stays an operator's until someone decides otherwise.
TENANT_NODE_KEYS = (
    "name",
    "state",
    "reason",
    "cpus",
    "memory_mb",
    "sockets",
    "cores_per_socket",
    "threads_per_core",
    "features",
    "partitions",
    "cpus_alloc",
    "memory_alloc_mb",
    "gpus_alloc",
    "gpus",
)
TENANT_GPU_KEYS = ("index", "vendor", "model", "memory_mb", "profile")


def tenant_node(node: dict[str, Any]) -> dict[str, Any]:
    out = {key: node[key] for key in TENANT_NODE_KEYS if key in node}
    out["gpus"] = [
        {key: gpu[key] for key in TENANT_GPU_KEYS if key in gpu} for gpu in node.get("gpus", ())
    ]
    return out


def cluster_nodes(*, operator: bool = False) -> list[dict[str, Any]]:
    """The cluster's nodes: as a tenant sees them, or whole for an operator (staff)."""
    nodes = controller_client().nodes()
    return nodes if operator else [tenant_node(node) for node in nodes]


def cluster_queue(*, limit: int = 1000) -> list[dict[str, Any]]:
    """Every organisation's active jobs (pending, running, ...), for operators (staff): the
    first `limit` by job id, as job objects."""
    jobs = controller_client().jobs(states=sorted(ACTIVE_STATES))
    return [jobobject.from_controller(job) for job in jobs[:limit]]


def job_output(
    *, organization: Organization, job_id: int, stream: str, offset: int, limit: int
) -> dict[str, Any]:
    """A chunk of the organisation's job's output, from the agent of the job's first node
    (the batch script runs there; the controller knows the node's agent URL). Raises
    Http404 (missing, another organisation's, not started, or unknown to its agent) and
    JobOutputUnavailable (the controller or the agent cannot be reached)."""
    record = access_job(organization=organization, job_id=job_id)
    if not record.nodes:
        raise Http404(f"Job {job_id} has not started: there is no output yet.")
    node_name = str(record.nodes[0])
    try:
        nodes = controller_client().nodes()
    except Unavailable as exc:
        raise JobOutputUnavailable(f"The scheduler is unreachable: {exc.message}") from exc
    agent_url = next((n.get("agent_url") for n in nodes if n.get("name") == node_name), None)
    if not agent_url:
        raise JobOutputUnavailable(f"Node {node_name}, where job {job_id} ran, is not registered.")
    # Imported here: tasks imports the services, which import this module.
    from spurcloud.jobs.tasks import agent_client

    try:
        output: dict[str, Any] = agent_client(str(agent_url)).output(
            job_id, stream=stream, offset=offset, limit=limit
        )
    except NotFound as exc:
        raise Http404(f"Node {node_name} has no output of job {job_id}.") from exc
    except Unavailable as exc:
        raise JobOutputUnavailable(
            f"Node {node_name}, where job {job_id} ran, is unreachable: {exc.message}"
        ) from exc
    except RpcError as exc:  # a refusal: the agent and this site disagree
        raise JobOutputUnavailable(
            f"Node {node_name} refused to read job {job_id}'s output: {exc.message}"
        ) from exc
    return output


def cluster_partitions() -> list[dict[str, Any]]:
    return controller_client().partitions()


def gpu_models(nodes: list[dict[str, Any]]) -> list[str]:
    """The GPU models the cluster's nodes have, sorted."""
    return sorted({str(g["model"]) for n in nodes for g in n.get("gpus", ()) if g.get("model")})
