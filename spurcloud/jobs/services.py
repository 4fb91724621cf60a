"""The tenant-facing job service: submit and cancel through the controller, and the mirror
of the controller's job events in `JobRecord` (what sacct and the dashboard read)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone

from scheduler.client import JobNotFound, SubmitRefused
from scheduler.core.jobspec import InvalidSpec, JobSpec
from spurcloud.jobs import jobobject
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.errors import JobRejected, job_not_found_message
from spurcloud.jobs.live import push_job
from spurcloud.jobs.models import JobRecord, JobState
from spurcloud.jobs.selectors import access_job
from spurcloud.tenants.models import AuditEvent, Membership, Organization
from spurcloud.tenants.services import record_audit_event

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_PATTERN = "slurm-%j.out"


def _membership(*, organization: Organization, user: AbstractBaseUser) -> Membership:
    membership = Membership.objects.filter(organization=organization, user=user).first()
    if membership is None:
        raise PermissionDenied("You are not a member of this organisation.")
    return membership


def submit_job(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    spec: dict[str, Any],
    idempotency_key: str = "",
) -> dict[str, Any]:
    """Validates `spec` (a JobSpec dict), stamps who submits it, hands it to the controller
    and records the job as PENDING at once, so the history shows it before its first event.
    Returns the job object. Raises JobRejected (invalid or refused) and lets
    ControllerUnavailable through.

    The controller call cannot join the database transaction, so it comes first; the
    idempotency key makes a retried request (same key) land on the same job."""
    _membership(organization=organization, user=user)
    try:
        parsed = JobSpec.from_dict(spec)
    except InvalidSpec as exc:
        raise JobRejected(str(exc)) from exc
    username = user.get_username()
    if parsed.tenant not in ("", organization.slug) or parsed.user not in ("", username):
        raise JobRejected("tenant and user come from your API token; leave them out")
    parsed = parsed.replace(
        tenant=organization.slug, user=username, account=parsed.account or organization.slug
    )
    key = f"{organization.slug}:{idempotency_key}" if idempotency_key else uuid.uuid4().hex
    try:
        job_id = controller_client().submit(parsed.to_dict(), idempotency_key=key)
    except SubmitRefused as exc:
        raise JobRejected(exc.message) from exc

    with transaction.atomic():
        record, created = JobRecord.objects.get_or_create(
            cluster=settings.SPUR_CLUSTER_NAME,
            job_id=job_id,
            defaults=_pending_record_fields(organization, parsed),
        )
        if created:
            record_audit_event(
                organization=organization,
                actor=user,
                action=AuditEvent.Action.JOB_SUBMITTED,
                target=str(job_id),
                data={"name": parsed.name, "partition": parsed.partition},
            )
        elif record.spec is None:
            # The first event got here before us; events carry no spec.
            record.spec = parsed.to_dict()
            JobRecord.objects.filter(pk=record.pk, spec__isnull=True).update(spec=record.spec)
    return jobobject.from_record(record, tenant=organization.slug, with_spec=True)


def _pending_record_fields(organization: Organization, spec: JobSpec) -> dict[str, Any]:
    return {
        "organization": organization,
        "user": spec.user,
        "name": spec.name,
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos or "normal",
        "state": JobState.PENDING,
        "submit_time": timezone.now(),
        "time_limit_min": spec.time_limit_min,
        "num_nodes": spec.nodes,
        "num_cpus": spec.cpus_on_each_node * spec.nodes,
        "num_gpus": spec.gpus or spec.gpus_on_each_node * spec.nodes,
        "workdir": spec.workdir,
        "stdout": spec.stdout or DEFAULT_OUTPUT_PATTERN,
        "stderr": spec.stderr,
        "spec": spec.to_dict(),
    }


def cancel_job(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    job_id: int,
    signal: int | None = None,
) -> dict[str, Any]:
    """Cancels the job (or sends it `signal`, as `scancel --signal`), and returns the job
    object as the controller now has it. Owners and admins cancel any job of the
    organisation; members their own."""
    return _act_on_job(
        organization=organization,
        user=user,
        job_id=job_id,
        verb="cancel",
        call=lambda client, tenant, by: client.cancel(job_id, tenant=tenant, signal=signal, by=by),
        audit=AuditEvent.Action.JOB_CANCELLED,
        data={"signal": signal},
    )


JOB_ACTIONS = ("hold", "release", "requeue", "requeuehold")


def control_job(
    *, organization: Organization, user: AbstractBaseUser, job_id: int, action: str
) -> dict[str, Any]:
    """scontrol's hold, release, requeue and requeuehold, by the same rules as cancel. A
    tenant's hold is a user hold: only cluster operators place admin holds."""
    if action not in JOB_ACTIONS:
        raise JobRejected(f"unknown job action {action!r}")
    return _act_on_job(
        organization=organization,
        user=user,
        job_id=job_id,
        verb=action,
        call=lambda client, tenant, by: client.control(job_id, action, tenant=tenant),
        audit=AuditEvent.Action.JOB_CONTROLLED,
        data={"action": action},
    )


def _act_on_job(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    job_id: int,
    verb: str,
    call: Any,
    audit: str,
    data: dict[str, Any],
) -> dict[str, Any]:
    membership = _membership(organization=organization, user=user)
    record = access_job(organization=organization, job_id=job_id)
    username = user.get_username()
    if not membership.manages_organization and record.user != username:
        raise PermissionDenied(f"You can {verb} only your own jobs.")
    try:
        job = call(controller_client(), organization.slug, username)
    except JobNotFound as exc:
        raise Http404(job_not_found_message(job_id)) from exc
    except SubmitRefused as exc:
        raise JobRejected(exc.message) from exc
    with transaction.atomic():
        if "seq" in job and _apply_job_dict(job, seq=int(job["seq"])):
            # The event of this change will arrive as a duplicate and push nothing.
            record.refresh_from_db()
            transaction.on_commit(lambda: push_job(record))
        record_audit_event(
            organization=organization,
            actor=user,
            action=audit,
            target=str(job_id),
            data=data,
        )
    return jobobject.from_controller(job)


def _apply_job_dict(job: dict[str, Any], *, seq: int) -> int:
    """Writes the job dict over its record when `seq` is newer than what the record holds:
    a conditional UPDATE, so a duplicate or an older event changes nothing (no
    read-then-write race between workers)."""
    fields = jobobject.record_fields(job)
    fields["last_seq"] = seq
    fields["updated_at"] = timezone.now()  # update() skips auto_now
    return JobRecord.objects.filter(
        cluster=settings.SPUR_CLUSTER_NAME, job_id=int(job["job_id"]), last_seq__lt=seq
    ).update(**fields)


def record_job_event(*, event: dict[str, Any]) -> JobRecord | None:
    """Mirrors a controller job event (`{"seq", "cluster", "kind", "at", "job"}`) into the
    history. Returns the record when the event changed it; None when it was a duplicate,
    older than what the record holds, or for an organisation this site does not know."""
    job = event["job"]
    seq = int(event["seq"])
    job_id = int(job["job_id"])
    # The record is keyed by this site's cluster name, not the event's: the web serves one
    # cluster, and a misspelt name in one config must not fork the history.
    cluster = settings.SPUR_CLUSTER_NAME
    with transaction.atomic():
        if _apply_job_dict(job, seq=seq):
            return JobRecord.objects.select_related("organization").get(
                cluster=cluster, job_id=job_id
            )
        if JobRecord.objects.filter(cluster=cluster, job_id=job_id).exists():
            return None  # stale or duplicate
        organization = Organization.objects.filter(slug=job.get("tenant") or "").first()
        if organization is None:
            log.warning("job %s: event for unknown organisation %r", job_id, job.get("tenant"))
            return None
        fields = jobobject.record_fields(job)
        try:
            with transaction.atomic():
                return JobRecord.objects.create(
                    cluster=cluster,
                    job_id=job_id,
                    organization=organization,
                    last_seq=seq,
                    **fields,
                )
        except IntegrityError:
            pass
        # A submit or another worker inserted the row between our two statements.
        if _apply_job_dict(job, seq=seq):
            return JobRecord.objects.select_related("organization").get(
                cluster=cluster, job_id=job_id
            )
        return None


def record_job_events(*, events: list[dict[str, Any]]) -> list[JobRecord]:
    """Mirrors a batch of events in one transaction, oldest first; returns the records
    that changed (each once, in its newest form)."""
    changed: dict[int, JobRecord] = {}
    with transaction.atomic():
        for event in sorted(events, key=lambda e: int(e["seq"])):
            record = record_job_event(event=event)
            if record is not None:
                changed[record.job_id] = record
    return list(changed.values())
