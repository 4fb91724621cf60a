"""The tenant-facing job service: submit and act on jobs through the controller, and the
mirror of the controller's job events in `JobRecord` (what sacct and the dashboard read).

Errors: `JobRejected` (the spec is invalid: 400), `PermissionDenied`, `Http404` (missing
or another organisation's, one answer), and the RPC kit's errors from the controller
(`Refused` 400, `Conflict` 409, `Unavailable` 503), which the API answers as they are.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)
from django.db.models import Field
from django.http import Http404
from django.utils import timezone

from scheduler.core.contract import JobAction, JobSpec, outside_workspace
from scheduler.core.errors import InvalidSpec
from scheduler.rpc.errors import NotFound, RpcError
from spurcloud.billing import bulk
from spurcloud.billing.quotes import check_submissions_affordable, submit_terms
from spurcloud.billing.services import check_credit
from spurcloud.jobs import jobobject
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.errors import JobRejected, job_not_found_message
from spurcloud.jobs.live import push_job
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.selectors import access_job_or_task, cluster_nodes, cluster_partitions
from spurcloud.tenants.models import AuditEvent, Membership, Organization, SshKey
from spurcloud.tenants.selectors import (
    UNCONFIRMED_EMAIL_MESSAGE,
    email_confirmation_required,
    email_confirmed,
)
from spurcloud.tenants.services import record_audit_event

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)

# Failures of the database itself: the event batch is retried whole (the task's
# autoretry). Any other failure belongs to one event, which is logged and skipped.
RETRYABLE = (OperationalError, InterfaceError)


BILLING_ROLE_MESSAGE = (
    "Your role in this organisation is billing: you see its jobs and bills, but cannot "
    "submit or control jobs."
)


def _membership(*, organization: Organization, user: User) -> Membership:
    """The membership of a user who may submit and control jobs (every write here)."""
    membership = Membership.objects.filter(organization=organization, user=user).first()
    _check_runs_jobs(None if membership is None else membership.role)
    assert membership is not None
    return membership


def _check_runs_jobs(role: str | None) -> None:
    """PermissionDenied unless `role` (None: not a member) may submit and control jobs."""
    if role is None:
        raise PermissionDenied("You are not a member of this organisation.")
    if not Membership.role_runs_jobs(role):
        raise PermissionDenied(BILLING_ROLE_MESSAGE)


class Submitter:
    """What the caller already read of who submits (an API token read with its role and
    confirmed address, `tenants.selectors.api_token_for_secret`, kept API_TOKEN_CACHE_S
    seconds as authentication keeps it): `submit_jobs` then reads neither again."""

    __slots__ = ("email_confirmed", "role")

    def __init__(self, *, role: str | None, email_confirmed: bool) -> None:
        self.role, self.email_confirmed = role, email_confirmed


NEGATIVE_NICE_MESSAGE = (
    "nice: a negative nice raises the job's priority above other tenants' jobs; only "
    "cluster operators (staff, with an admin-scoped token) may set one. Use 0 or more."
)


SSH_KEYS_MESSAGE = (
    "ssh_keys come from your account's SSH keys (the account page): a job may carry only "
    "keys you added there."
)


# Slurm's words (ESLURM_ACCESS_DENIED) for what only an administrator may do.
OPERATORS_ONLY_MESSAGE = "Access/permission denied"


def parse_spec(
    *, organization: Organization, user: User, spec: Any, operator: bool = False
) -> JobSpec:
    """The JobSpec a member submits (a spec dict, or a JobSpec the API's serializer
    already parsed), stamped with who submits it. Raises JobRejected. `operator`: the
    caller acts as a cluster operator (the API: a staff user's admin-scoped token),
    which the user's staff flag must confirm; only then may `nice` be negative."""
    try:
        parsed = spec if isinstance(spec, JobSpec) else JobSpec.from_dict(spec)
    except InvalidSpec as exc:
        raise JobRejected(exc.message, field=exc.field) from exc
    if parsed.nice < 0 and not (operator and user.is_staff):
        raise JobRejected(NEGATIVE_NICE_MESSAGE, field="nice")
    username = user.get_username()
    if parsed.tenant not in ("", organization.slug) or parsed.user not in ("", username):
        raise JobRejected("tenant and user come from your API token; leave them out")
    # Stamped like tenant and user: a job opens SSH to its submitter's own keys only.
    if parsed.ssh_keys:
        own = set(SshKey.objects.filter(user=user).values_list("public_key", flat=True))
        if not set(parsed.ssh_keys) <= own:
            raise JobRejected(SSH_KEYS_MESSAGE, field="ssh_keys")
    outside = outside_workspace(parsed, str(workspace(organization)))
    if outside is not None:
        field, message = outside
        raise JobRejected(message, field=field)
    try:
        return parsed.replace(
            tenant=organization.slug, user=username, account=parsed.account or organization.slug
        )
    except InvalidSpec as exc:  # a user or organisation name longer than a spec allows
        raise JobRejected(exc.message, field=exc.field) from exc


def workspace(organization: Organization) -> Path:
    """The organisation's workspace on the nodes, where its jobs run and write."""
    return Path(settings.SPUR_WORK_ROOT) / organization.slug


def submit_job(
    *,
    organization: Organization,
    user: User,
    spec: Any,
    idempotency_key: str = "",
    operator: bool = False,
) -> dict[str, Any]:
    """One submission (`submit_jobs` with one spec): the job object, or the controller's
    refusal raised."""
    (result,) = submit_jobs(
        organization=organization,
        user=user,
        specs=[spec],
        idempotency_key=idempotency_key,
        operator=operator,
    )
    if isinstance(result, RpcError):
        raise result
    return result


def submit_jobs(
    *,
    organization: Organization,
    user: User,
    specs: Sequence[Any],
    idempotency_key: str = "",
    operator: bool = False,
    submitter: Submitter | None = None,
) -> list[dict[str, Any] | RpcError]:
    """Validates each of `specs` (JobSpec dicts), stamps who submits them, hands them to
    the controller together (one round trip, one Raft log entry where they fit), and
    records each job as the controller answered (one transaction): the history shows it
    before its first event arrives, and that event, carrying the same sequence number,
    then changes nothing. Returns each job object, or the error that refused that one
    alone (e.g. more GPUs than the cluster has), in order.

    Every spec is checked before any is sent: one invalid refuses them all (JobRejected,
    naming it by its index when there are several), and nothing is submitted. The
    controller call cannot join the database transaction, so it comes first; the
    idempotency key (with each submission's index when there are several) makes a
    retried request land on the same jobs.

    Refused (PermissionDenied) to a user who has not confirmed their email where that is
    required (SIGNUP_MODE verified or invite), (JobRejected) a negative nice unless
    `operator` (see parse_spec), and (PaymentRequired) when the organisation's prepaid
    credit is used up or cannot cover the submissions' estimated cost."""
    if submitter is None:
        _membership(organization=organization, user=user)
        confirmed = email_confirmed(user=user)
    else:
        _check_runs_jobs(submitter.role)
        confirmed = submitter.email_confirmed or not email_confirmation_required()
    if not confirmed:
        raise PermissionDenied(UNCONFIRMED_EMAIL_MESSAGE)
    parsed = []
    for index, spec in enumerate(specs):
        try:
            parsed.append(
                parse_spec(organization=organization, user=user, spec=spec, operator=operator)
            )
        except JobRejected as exc:
            if len(specs) == 1:
                raise
            field = f"{index}.{exc.field}" if exc.field else str(index)
            raise JobRejected(f"job {index}: {exc.message}", field=field) from exc
    # Every path that submits (API, slurmrestd, portal) comes here: a used-up prepaid
    # credit refuses it (billing.errors.PaymentRequired, 402) before the controller hears.
    # The account and, for a prepaid one, the price book: one read, fresh each time.
    terms = submit_terms(organization=organization)
    check_credit(organization=organization, account=terms)
    # ... and so does one whose estimate (price x resources x time limit) a prepaid
    # balance cannot cover; the cluster's partitions and nodes are read only when needed.
    check_submissions_affordable(
        organization=organization,
        specs=parsed,
        partitions=cluster_partitions,
        nodes=cluster_nodes,
        account=terms,
        prices=terms.prices,
    )
    keys = [
        (f"{organization.slug}:{idempotency_key}" + (f":{i}" if len(specs) > 1 else ""))
        if idempotency_key
        else uuid.uuid4().hex
        for i in range(len(parsed))
    ]
    answers = controller_client().submit_many(
        [(spec.to_dict(), key) for spec, key in zip(parsed, keys, strict=True)]
    )
    accepted = [
        (spec, answer)
        for spec, answer in zip(parsed, answers, strict=True)
        if not isinstance(answer, RpcError)
    ]
    objects = iter(
        _record_submitted(organization, user, accepted, retried=bool(idempotency_key))
        if accepted
        else []
    )
    return [a if isinstance(a, RpcError) else next(objects) for a in answers]


def _record_submitted(
    organization: Organization,
    user: User,
    accepted: Sequence[tuple[JobSpec, dict[str, Any]]],
    *,
    retried: bool,
) -> list[dict[str, Any]]:
    """The history's records of the jobs the controller accepted, and their audit events,
    in one transaction of one statement each (the hot path of every submission): each
    job object as the controller answered it.

    A record the first event wrote before us (events carry no spec) gets the spec, and
    keeps what the event wrote; one that a retry of the same submission wrote (the same
    idempotency key lands on the same job) is the same row. The audit event is written
    once a job: where a retry may have written it (`retried`: the submission carried an
    idempotency key), the jobs that have one are read first."""
    cluster = settings.SPUR_CLUSTER_NAME
    records = [
        JobRecord(
            cluster=cluster,
            job_id=int(job["job_id"]),
            organization=organization,
            last_seq=int(job.get("seq") or 0),
            **jobobject.record_fields(job),
        )
        for _, job in accepted
    ]
    audited: set[str] = set()
    with transaction.atomic():
        # INSERT ... ON CONFLICT (cluster, job_id) DO UPDATE SET spec: no savepoint, no
        # SELECT before it, whichever of the submission and the first event comes first.
        bulk.insert_objects(JobRecord, records, unique=["cluster", "job_id"], update=["spec"])
        if retried:
            audited = set(
                AuditEvent.objects.filter(
                    organization=organization,
                    action=AuditEvent.Action.JOB_SUBMITTED,
                    target__in=[str(r.job_id) for r in records],
                ).values_list("target", flat=True)
            )
        bulk.insert_objects(
            AuditEvent,
            [
                AuditEvent(
                    organization=organization,
                    actor=user,
                    action=AuditEvent.Action.JOB_SUBMITTED,
                    target=str(record.job_id),
                    data={"name": spec.name, "partition": spec.partition},
                )
                for (spec, _), record in zip(accepted, records, strict=True)
                if str(record.job_id) not in audited
            ],
        )
    return [
        jobobject.from_record(record, tenant=organization.slug, with_spec=True)
        for record in records
    ]


def act_on_job(
    *,
    organization: Organization,
    user: User,
    job_id: int,
    action: JobAction,
    signal: int | None = None,
    operator: bool = False,
) -> dict[str, Any]:
    """One of the contract's job actions (scancel [--signal], scontrol hold, release,
    requeue, requeuehold, suspend, resume); returns the job object as the controller now
    has it. Owners and admins act on any job of the organisation, members on their own.
    A tenant's hold is a user hold: only cluster operators place admin holds. The
    operator-only actions (suspend, resume) are a cluster operator's alone (`operator`:
    a staff user's admin-scoped token), as only Slurm's administrators may."""
    action = JobAction(action)
    if signal is not None and not action.takes_signal:
        raise JobRejected(f"{action} takes no signal", field="signal")
    membership = _membership(organization=organization, user=user)
    record = access_job_or_task(organization=organization, job_id=job_id)
    username = user.get_username()
    admin = operator and user.is_staff
    if action.operator_only:
        if not admin:
            raise PermissionDenied(OPERATORS_ONLY_MESSAGE)
    elif not membership.manages_organization and record.user != username:
        raise PermissionDenied(f"You can {action} only your own jobs.")
    try:
        job = controller_client().act(
            job_id,
            action,
            tenant=organization.slug,
            signal=signal,
            by=username,
            admin=admin and action.operator_only,
        )
    except NotFound as exc:
        raise Http404(job_not_found_message(job_id)) from exc
    with transaction.atomic():
        if "seq" in job and _apply_job_dict(job, seq=int(job["seq"])):
            # The event of this change will arrive as a duplicate and push nothing.
            record = _fresh(record)
            transaction.on_commit(lambda: push_job(record))
        data: dict[str, Any]
        if action is JobAction.CANCEL:
            audit, data = AuditEvent.Action.JOB_CANCELLED, {"signal": signal}
        else:
            audit, data = AuditEvent.Action.JOB_CONTROLLED, {"action": action.value}
        record_audit_event(
            organization=organization, actor=user, action=audit, target=str(job_id), data=data
        )
    return jobobject.from_controller(job)


def _fresh(record: JobRecord) -> JobRecord:
    """The record as the database has it now (an array's task read live had no row: the
    row its event made since)."""
    if record.pk is None:
        return JobRecord.objects.select_related("organization").get(
            cluster=settings.SPUR_CLUSTER_NAME, job_id=record.job_id
        )
    record.refresh_from_db()
    return record


def _apply_job_dict(job: dict[str, Any], *, seq: int) -> int:
    """Writes the job dict over its record when `seq` is newer than what the record holds:
    a conditional UPDATE, so a duplicate or an older event changes nothing (no
    read-then-write race between workers).

    The statement is written once for each set of columns an event sets and reused,
    its values prepared by each column's field as `QuerySet.update` prepares them:
    building that query for every event (a filter, an update of some twenty values,
    compiled) was most of what the worker spent mirroring an event."""
    fields = jobobject.record_fields(job)
    fields["last_seq"] = seq
    fields["updated_at"] = timezone.now()  # update() skips auto_now
    sql, columns = _newer_update(tuple(fields))
    params = [
        column.get_db_prep_save(value, connection=connection)
        for column, value in zip(columns, fields.values(), strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, settings.SPUR_CLUSTER_NAME, int(job["job_id"]), seq])
        return int(cursor.rowcount)


_NEWER_UPDATES: dict[tuple[str, tuple[str, ...]], tuple[str, list[Field[Any, Any]]]] = {}


def _newer_update(names: tuple[str, ...]) -> tuple[str, list[Field[Any, Any]]]:
    """`UPDATE jobs_jobrecord SET <names> WHERE cluster, job_id, last_seq < seq`, and the
    fields of the columns it sets, in order (per database vendor: quoting differs)."""
    key = (connection.vendor, names)
    found = _NEWER_UPDATES.get(key)
    if found is None:
        quote = connection.ops.quote_name

        def column(name: str) -> str:
            return quote(str(_record_field(name).column))

        columns = [_record_field(name) for name in names]
        sets = ", ".join(f"{column(name)} = %s" for name in names)
        where = (
            f"{column('cluster')} = %s AND {column('job_id')} = %s AND {column('last_seq')} < %s"
        )
        table = quote(JobRecord._meta.db_table)
        sql = f"UPDATE {table} SET {sets} WHERE {where}"  # noqa: S608 - the model's names
        found = _NEWER_UPDATES[key] = (sql, columns)
    return found


def _record_field(name: str) -> Field[Any, Any]:
    field = JobRecord._meta.get_field(name)
    assert isinstance(field, Field), f"JobRecord.{name} is no column"
    return field


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
    if _apply_job_dict(job, seq=seq):
        return JobRecord.objects.select_related("organization").get(cluster=cluster, job_id=job_id)
    if JobRecord.objects.filter(cluster=cluster, job_id=job_id).exists():
        return None  # stale or duplicate
    organization = Organization.objects.filter(slug=job.get("tenant") or "").first()
    if organization is None:
        log.warning("job %s: event for unknown organisation %r", job_id, job.get("tenant"))
        return None
    try:
        with transaction.atomic():
            return JobRecord.objects.create(
                cluster=cluster,
                job_id=job_id,
                organization=organization,
                last_seq=seq,
                **jobobject.record_fields(job),
            )
    except IntegrityError:
        # Either a submit or another worker inserted the row between our two statements
        # (then it exists now), or the database refused this event (then it does not).
        if not JobRecord.objects.filter(cluster=cluster, job_id=job_id).exists():
            raise
    # The row is someone else's insert: apply the event over it if it is newer.
    if _apply_job_dict(job, seq=seq):
        return JobRecord.objects.select_related("organization").get(cluster=cluster, job_id=job_id)
    return None


def record_job_events(*, events: list[dict[str, Any]]) -> list[int]:
    """Mirrors a batch of events, oldest first; returns the ids of the jobs whose records
    changed, each once, in the order they first changed (`job_records` reads them for
    whoever needs them: the portal's push, which the embedded platform does not make).
    An event of a job that has a record is one conditional UPDATE in autocommit (no
    transaction around it, no read after it); only a job's first event, which inserts,
    takes a transaction (a savepoint). An event the database refuses is logged with its
    job and skipped, and never takes the others with it. A failure of the database
    itself propagates, for the batch to be retried."""
    changed: list[int] = []
    held = _held_seqs(events)
    for event in sorted(events, key=lambda e: int(e["seq"])):
        job_id = event.get("job", {}).get("job_id")
        if held.get(job_id, -1) >= int(event["seq"]):
            # Stale or a duplicate (the submission already wrote this seq): nothing to
            # write, and no transaction opened for it. A record's seq only grows, so
            # what was read before the loop can only say "newer" too early, never late.
            continue
        try:
            if job_id in held:
                # One statement: in autocommit it is its own transaction; inside a caller's
                # (an eager task, a test), a savepoint keeps a refusal from breaking it.
                with transaction.atomic() if connection.in_atomic_block else nullcontext():
                    wrote = bool(_apply_job_dict(event["job"], seq=int(event["seq"])))
            else:
                with transaction.atomic():
                    wrote = record_job_event(event=event) is not None
        except RETRYABLE:
            raise
        except (DatabaseError, KeyError, TypeError, ValueError):
            log.exception(
                "job %s: event seq %s (cmd %s) could not be recorded; skipped",
                job_id,
                event.get("seq"),
                event.get("cmd_id"),
            )
            continue
        if wrote:
            changed.append(int(job_id))
            held.setdefault(job_id, int(event["seq"]))
    return list(dict.fromkeys(changed))


def job_records(*, job_ids: Sequence[int]) -> list[JobRecord]:
    """The records of `job_ids` (this cluster's), in that order, in their newest form,
    read in one query."""
    if not job_ids:
        return []
    records = {
        r.job_id: r
        for r in JobRecord.objects.select_related("organization").filter(
            cluster=settings.SPUR_CLUSTER_NAME, job_id__in=set(job_ids)
        )
    }
    return [records[i] for i in job_ids if i in records]


def _held_seqs(events: list[dict[str, Any]]) -> dict[Any, int]:
    """The seq each batch's job's record holds, in one read (jobs without a record, and
    malformed events, are left to `record_job_event`)."""
    ids = set()
    for event in events:
        job_id = event.get("job", {}).get("job_id") if isinstance(event, dict) else None
        if isinstance(job_id, int) and not isinstance(job_id, bool):
            ids.add(job_id)
    if not ids:
        return {}
    return dict(
        JobRecord.objects.filter(cluster=settings.SPUR_CLUSTER_NAME, job_id__in=ids).values_list(
            "job_id", "last_seq"
        )
    )


def update_job(
    *,
    organization: Organization,
    user: User,
    job_id: int,
    changes: dict[str, Any],
    operator: bool = False,
) -> dict[str, Any]:
    """scontrol update: change a pending job's name, time limit, nice, partition or comment
    (the contract's UPDATE_FIELDS; `changes` as the API's serializer checked them).
    Owners and admins update any job of the organisation, members their own; only a
    cluster operator may set a negative nice. Returns the job as the controller now has it."""
    membership = _membership(organization=organization, user=user)
    record = access_job_or_task(organization=organization, job_id=job_id)
    username = user.get_username()
    if not membership.manages_organization and record.user != username:
        raise PermissionDenied("You can update only your own jobs.")
    admin = operator and user.is_staff
    if int(changes.get("nice") or 0) < 0 and not admin:
        raise JobRejected(NEGATIVE_NICE_MESSAGE, field="nice")
    try:
        if not changes:  # nothing to change: the job as it is, and no audit row
            return jobobject.from_controller(
                controller_client().job(job_id, tenant=organization.slug)
            )
        job = controller_client().update(job_id, changes, tenant=organization.slug, admin=admin)
    except NotFound as exc:
        raise Http404(job_not_found_message(job_id)) from exc
    with transaction.atomic():
        if "seq" in job and _apply_job_dict(job, seq=int(job["seq"])):
            record = _fresh(record)
            transaction.on_commit(lambda: push_job(record))
        record_audit_event(
            organization=organization,
            actor=user,
            action=AuditEvent.Action.JOB_CONTROLLED,
            target=str(job_id),
            data={"action": "update", "changes": changes},
        )
    return jobobject.from_controller(job)
