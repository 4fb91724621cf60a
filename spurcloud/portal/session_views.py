"""The session pages: launching one (the launch page's second form), its page with its
lifecycle kept live (htmx polls the status fragment), and its Stop button.

A session is its job (sessions.py): read through `jobs.selectors.access_job` (the same
404 for a missing session and another organisation's) and stopped through
`jobs.services.act_on_job`, as the job pages and the API do."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from scheduler.core.contract import JobAction, JobState
from scheduler.rpc.errors import RpcError
from spurcloud.headers import TERMINAL_PAGE_POLICY
from spurcloud.jobs import services
from spurcloud.jobs.errors import JobOutputUnavailable, JobRejected
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.selectors import access_job, job_output
from spurcloud.portal import job_views
from spurcloud.portal.htmx import fragment, is_htmx
from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.portal.session_activity import last_session_activity
from spurcloud.portal.session_culling import idle_ends_at
from spurcloud.portal.session_forms import SessionLaunchForm
from spurcloud.portal.session_ssh import launch_keys, ssh_details
from spurcloud.portal.session_terminal import session_access
from spurcloud.portal.sessions import (
    READY_LINE,
    Phase,
    ends_at,
    phase,
    session_templates,
    template_key,
    warn_before_end,
)
from spurcloud.tenants.models import Membership

READY_PROBE_BYTES = 4096  # the ready line comes among the script's first lines


def _session(membership: Membership, job_id: int) -> tuple[JobRecord, str]:
    record = access_job(organization=membership.organization, job_id=job_id)
    key = template_key(record.spec)
    if key is None:
        raise Http404(f"Job {job_id} is not a session.")
    return record, key


def _ready(membership: Membership, record: JobRecord) -> bool:
    """Whether the session's script has said it is ready (read from its agent)."""
    if record.state != JobState.RUNNING.value:
        return False
    try:
        chunk = job_output(
            organization=membership.organization,
            job_id=record.job_id,
            stream="stdout",
            offset=0,
            limit=READY_PROBE_BYTES,
        )
    except (Http404, JobOutputUnavailable):
        return False  # not there yet, or its agent is unreachable: still starting
    return READY_LINE in str(chunk.get("data") or "")


def _status(membership: Membership, record: JobRecord, key: str) -> dict[str, Any]:
    now = timezone.now()
    end = ends_at(record.start_time, record.time_limit_min)
    current = phase(record.state, ready=_ready(membership, record))
    template = session_templates().get(key)
    live = current in (Phase.STARTING, Phase.RUNNING)
    idle_end = idle_ends_at(record, last_session_activity(record.job_id)) if live else None
    return {
        "record": record,
        "phase": current,
        "template_title": template.title if template else key,
        # ISO 8601, as the `when` filter shows job times (in the viewer's zone).
        "ends_at": end.isoformat() if end else None,
        "started": record.start_time.isoformat() if record.start_time else None,
        "ended": record.end_time.isoformat() if record.end_time else None,
        "minutes_left": max(0, int((end - now).total_seconds() // 60)) if end else None,
        "warn": live and warn_before_end(end, now),
        # Idle culling (session_culling.py): the earlier of the two ends is the one shown.
        "idle_warn": live
        and warn_before_end(idle_end, now)
        and (end is None or idle_end is None or idle_end < end),
        "idle_ends_at": idle_end.isoformat() if idle_end else None,
        "idle_minutes_left": max(0, int((idle_end - now).total_seconds() // 60))
        if idle_end
        else None,
        "idle_minutes": settings.SPUR_SESSION_IDLE_MINUTES,
        "can_stop": membership.runs_jobs and current not in (Phase.STOPPING, Phase.ENDED),
        "phases": list(Phase),
        "web_title": template.web if template else "",
        "web_url": _web_url(membership, record)
        if current is Phase.RUNNING and template and template.web
        else "",
        "ssh": ssh_details(membership=membership, record=record) if live else None,
    }


def _web_url(membership: Membership, record: JobRecord) -> str:
    """The session's web service through the portal's proxy, for those it lets in."""
    try:
        session_access(membership=membership, job_id=record.job_id, own_only=True)
    except (PermissionDenied, Http404):
        return ""
    return reverse("portal:session-jupyter", kwargs={"job_id": str(record.job_id), "rest": "lab"})


@with_membership
def session_detail(
    request: AuthenticatedHttpRequest, membership: Membership, job_id: int
) -> HttpResponse:
    record, key = _session(membership, job_id)
    context = _status(membership, record, key)
    # Who may open its terminal (session_terminal.py decides again on each connection).
    context["terminal"] = membership.runs_jobs and (
        membership.manages_organization or record.user == request.user.get_username()
    )
    response = render(request, "portal/session_detail.html", context)
    if context["terminal"]:
        response["Content-Security-Policy"] = TERMINAL_PAGE_POLICY
    return response


@with_membership
def session_status(
    request: AuthenticatedHttpRequest, membership: Membership, job_id: int
) -> HttpResponse:
    """The page's live part, which htmx fetches every few seconds; a browser that opens
    its address goes to the session's page."""
    record, key = _session(membership, job_id)
    if not is_htmx(request):
        return redirect("portal:session-detail", job_id)
    response = fragment(request, "portal/_session_status.html", _status(membership, record, key))
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@with_membership
def session_stop(
    request: AuthenticatedHttpRequest, membership: Membership, job_id: int
) -> HttpResponse:
    """Stop: the job's cancel, through the API's service (a member stops only their own).
    To htmx it answers with the session's live part as it is now."""
    _session(membership, job_id)
    try:
        services.act_on_job(
            organization=membership.organization,
            user=request.user,
            job_id=job_id,
            action=JobAction.CANCEL,
        )
    except JobRejected as exc:
        messages.error(request, exc.message)
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    except RpcError as exc:
        messages.error(request, f"Session {job_id}: {job_views.scheduler_message(exc)}")
    else:
        messages.success(request, f"Session {job_id}: stopping.")
    if is_htmx(request):
        record, key = _session(membership, job_id)
        return fragment(request, "portal/_session_status.html", _status(membership, record, key))
    return redirect("portal:session-detail", job_id)


@require_POST
@with_membership
def session_launch(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    models, partitions, unavailable = job_views.launch_choices()
    # The launcher's account keys open the session over SSH (session_ssh.py).
    form = SessionLaunchForm(request.POST, gpu_models=models, ssh_keys=launch_keys(request.user))
    if form.is_valid():
        job = job_views.submit_from_form(request, membership, form)
        if job is not None:
            return redirect("portal:session-detail", int(job["job_id"]))
    return job_views.render_launch(
        request, membership, models, partitions, unavailable, session_form=form
    )
