"""Reads of the job history. Every read is scoped to one organisation."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils import timezone

from spurcloud.jobs import jobobject
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.errors import job_not_found_message
from spurcloud.jobs.models import ACTIVE_STATES, JobRecord
from spurcloud.tenants.models import Organization


def access_job(*, organization: Organization, job_id: int) -> JobRecord:
    """The organisation's job; the same 404 whether it is missing or someone else's."""
    record = JobRecord.objects.filter(organization=organization, job_id=job_id).first()
    if record is None:
        raise Http404(job_not_found_message(job_id))
    return record


def job_history(
    *,
    organization: Organization,
    ids: Iterable[int] | None = None,
    states: Iterable[str] | None = None,
    name: str | None = None,
    user: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[JobRecord]:
    """The organisation's jobs, filtered as sacct filters: `since`/`until` select jobs that
    were not over before `since` and had been submitted by `until`."""
    jobs = JobRecord.objects.filter(organization=organization)
    if ids:
        wanted = list(ids)
        # An array job id names all of its tasks, as in sacct -j.
        jobs = jobs.filter(Q(job_id__in=wanted) | Q(array_job_id__in=wanted))
    if states:
        jobs = jobs.filter(state__in=list(states))
    if name:
        jobs = jobs.filter(name=name)
    if user:
        jobs = jobs.filter(user=user)
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
    user: str | None = None,
    ids: Iterable[int] | None = None,
    ended_window_s: float | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """The organisation's jobs as the controller has them now (what squeue reads): active
    ones, and those that ended within `ended_window_s` (SPUR_QUEUE_ENDED_WINDOW_S), as job
    objects, in job id order."""
    window = settings.SPUR_QUEUE_ENDED_WINDOW_S if ended_window_s is None else ended_window_s
    horizon = (now or timezone.now()).timestamp() - window
    jobs = controller_client().jobs(
        tenant=organization.slug, states=list(states or ()), ids=list(ids or ()), user=user
    )
    live = [
        job
        for job in jobs
        if job.get("tenant") == organization.slug
        and (job.get("state") in ACTIVE_STATES or (job.get("end_time") or 0) >= horizon)
    ]
    live.sort(key=lambda job: int(job["job_id"]))
    return [jobobject.from_controller(job) for job in live]


def cluster_nodes() -> list[dict[str, Any]]:
    return controller_client().nodes()


def cluster_partitions() -> list[dict[str, Any]]:
    return controller_client().partitions()
