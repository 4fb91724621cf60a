"""Idle culling: a running session nobody used for SPUR_SESSION_IDLE_MINUTES is stopped.

"Used" is what session_activity.py records (web terminal and Jupyter proxy traffic), and
SSH traffic, which the session's agent counts (asked only of sessions near their idle
end, session_ssh.ssh_activity); a session never used counts from its start. The
periodic task (portal/tasks.py, every minute from beat) stops each idle session through
the job action service, as its own user when they still run jobs in the organisation,
else as its first owner (as billing stops unpaid work), so the stop is audited like any
other. The page warns SPUR_SESSION_WARN_MIN before the idle end (`idle_ends_at`)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from scheduler.core.contract import JobAction, JobState
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import act_on_job
from spurcloud.portal.session_activity import last_session_activities, note_session_activity
from spurcloud.portal.session_ssh import ssh_activity
from spurcloud.portal.sessions import COMMENT_PREFIX, QOS
from spurcloud.tenants.models import Membership

log = logging.getLogger(__name__)


def idle_limit() -> timedelta:
    return timedelta(minutes=int(settings.SPUR_SESSION_IDLE_MINUTES))


def idle_ends_at(record: JobRecord, last_used: float | None) -> datetime | None:
    """When the session is stopped if nobody uses it before; None before it started."""
    since = datetime.fromtimestamp(last_used, UTC) if last_used is not None else None
    if record.start_time is not None and (since is None or since < record.start_time):
        since = record.start_time
    return since + idle_limit() if since is not None else None


def running_sessions() -> list[JobRecord]:
    return list(
        JobRecord.objects.filter(
            state=JobState.RUNNING.value,
            spec__qos=QOS,
            spec__comment__startswith=COMMENT_PREFIX,
        )
        .select_related("organization")
        .order_by("job_id")
    )


def idle_sessions(*, now: datetime | None = None) -> list[JobRecord]:
    """The running sessions whose idle time is up. Those near it are first asked of their
    nodes: a session used over SSH (agents/ssh.py) never passed through this site, and
    its use is noted here then, which also lifts the page's warning."""
    now = now or timezone.now()
    sessions = running_sessions()
    used = last_session_activities([r.job_id for r in sessions])
    soon = now + timedelta(minutes=int(settings.SPUR_SESSION_WARN_MIN))
    near = [
        r
        for r in sessions
        if (end := idle_ends_at(r, used.get(r.job_id))) is not None and end <= soon
    ]
    for job_id, at in ssh_activity(near).items():
        if at > used.get(job_id, 0.0):
            note_session_activity(job_id, now=at)
            used[job_id] = at
    return [
        r
        for r in sessions
        if (end := idle_ends_at(r, used.get(r.job_id))) is not None and end <= now
    ]


def _actor(record: JobRecord) -> Membership | None:
    """Who stops it: its own user while they run jobs there, else the first owner."""
    members = Membership.objects.filter(organization=record.organization).select_related("user")
    own = members.filter(user__username=record.user).first()
    if own is not None and own.runs_jobs:
        return own
    return members.filter(role=Membership.Role.OWNER).order_by("pk").first()


def cull_idle_sessions(*, now: datetime | None = None) -> list[int]:
    """Stops every idle session; the job ids it stopped."""
    stopped = []
    for record in idle_sessions(now=now):
        actor = _actor(record)
        if actor is None:
            log.error(
                "session %s is idle, but nobody in its organisation may stop it", record.job_id
            )
            continue
        try:
            act_on_job(
                organization=record.organization,
                user=actor.user,
                job_id=record.job_id,
                action=JobAction.CANCEL,
            )
        except Exception:  # one refusal (it ended meanwhile: 409) must not keep the rest
            log.exception("idle session %s could not be stopped", record.job_id)
            continue
        stopped.append(record.job_id)
    if stopped:
        log.warning(
            "stopped sessions idle for %s minutes: %s", settings.SPUR_SESSION_IDLE_MINUTES, stopped
        )
    return stopped
