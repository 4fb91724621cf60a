"""The job pages: the list (filters, pages, live rows), a job's detail (allocation, times,
exit, its output's live tail and download, the contract's actions), and the launch form.

Each is thin: jobs are read through `jobs.selectors` (`access_job`: the same 404 for a
missing job and another organisation's) and changed through `jobs.services`, the very
functions the REST API calls, so the portal refuses what the API refuses, in its words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from scheduler.core.contract import JobAction, JobState
from scheduler.rpc.errors import RpcError, Unavailable
from spurcloud.billing.errors import PaymentRequired
from spurcloud.jobs import jobobject, services
from spurcloud.jobs.errors import JobOutputUnavailable, JobRejected
from spurcloud.jobs.selectors import (
    access_job,
    cluster_nodes,
    cluster_partitions,
    gpu_models,
    job_history,
    job_output,
)
from spurcloud.portal.htmx import is_htmx, page_or_fragment
from spurcloud.portal.job_forms import JobFilterForm, LaunchForm
from spurcloud.portal.job_rows import ROW_FIELDS, job_rows
from spurcloud.portal.launch_quote import price_list, quote
from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.portal.session_forms import SessionLaunchForm
from spurcloud.portal.sessions import template_key
from spurcloud.tenants.models import Membership

JOBS_PER_PAGE = 50


def scheduler_message(exc: RpcError) -> str:
    """The words for a controller's error: unreachable, or its own refusal."""
    if isinstance(exc, Unavailable):
        return f"The scheduler is unreachable: {exc.message}"
    return exc.message


def scheduler_read_error(exc: RpcError) -> str:
    """Why a page cannot show what it reads from the controller (unreachable, or it
    refused this site: a misconfigured cluster token)."""
    if isinstance(exc, Unavailable):
        return scheduler_message(exc)
    return f"The scheduler answered with an error: {exc.message}"


@with_membership
def job_list(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    organization = membership.organization
    form = JobFilterForm(request.GET)
    if form.is_valid():
        records = job_history(organization=organization, **form.filters())
    else:  # a filter it cannot apply: its error, and no rows rather than every row
        records = job_history(organization=organization).none()
    # The columns its rows show, no more (a job's spec, allocation and steps are not read).
    rows = jobobject.history_values(records.order_by("-job_id"), ROW_FIELDS)
    paginator = Paginator(rows, JOBS_PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    filtered = any(form.data.get(key) for key in form.fields)
    # Filters and pages, by htmx, swap the results alone (the form stays as typed).
    return page_or_fragment(
        request,
        page="portal/jobs.html",
        template="portal/_jobs_results.html",
        context={
            "form": form,
            "filter_fields": form.fields_html,  # called by the page only (not the fragment)
            "page": page,
            "rows": job_rows(
                jobobject.from_values(r, tenant=organization.slug, fields=ROW_FIELDS) for r in page
            ),
            "query": query.urlencode(),
            # New jobs join the live table only where they belong: page 1, unfiltered.
            "live_insert": page.number == 1 and not filtered,
        },
    )


def _allocation_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Which GPUs (and CPUs and memory) on which node, in allocation order."""
    allocation = job.get("allocation") or {}
    rows = []
    for node in job.get("nodes") or ():
        held = allocation.get(node) or {}
        rows.append(
            {
                "node": node,
                "gpus": held.get("gpus") or [],
                "gpu_milli": held.get("gpu_milli") or [],
                "cpus": held.get("cpus"),
                "mem_mb": held.get("mem_mb"),
            }
        )
    return rows


def _job_context(membership: Membership, job_id: int) -> dict[str, Any]:
    organization = membership.organization
    record = access_job(organization=organization, job_id=job_id)
    job = jobobject.from_record(record, tenant=organization.slug, with_spec=True)
    # Actions while the job is active, for those who may control jobs at all (the
    # service still decides each: a member acts on their own jobs only).
    offered = JobState(job["state"]).is_active and membership.runs_jobs
    return {
        "job": job,
        "spec": job.get("spec") or {},
        "allocation": _allocation_rows(job),
        "actions": [
            {"action": a, "url": reverse(f"portal:job-{a.value}", args=[job_id])} for a in JobAction
        ]
        if offered
        else [],
        "output_ws_path": f"/ws/jobs/{job_id}/output/",
        "is_session": template_key(record.spec) is not None,
    }


@with_membership
def job_detail(
    request: AuthenticatedHttpRequest, membership: Membership, job_id: int
) -> HttpResponse:
    return page_or_fragment(
        request,
        page="portal/job_detail.html",
        template="portal/_job_summary.html",
        context=_job_context(membership, job_id),
    )


@require_POST
@with_membership
def job_action(
    request: AuthenticatedHttpRequest, membership: Membership, job_id: int, action: JobAction
) -> HttpResponse:
    """One of the contract's actions, through the API's own service; a refusal (not your
    job, not in a state that allows it, the scheduler down) is shown on the job's page.
    To htmx it answers with the job's facts and actions as they are now; otherwise it
    sends the browser back to the job's page."""
    try:
        services.act_on_job(
            organization=membership.organization, user=request.user, job_id=job_id, action=action
        )
    except JobRejected as exc:
        messages.error(request, exc.message)
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    except RpcError as exc:
        messages.error(request, f"Job {job_id}: {scheduler_message(exc)}")
    else:
        messages.success(request, f"Job {job_id}: {action.value} requested.")
    if is_htmx(request):
        return page_or_fragment(
            request,
            page="portal/job_detail.html",
            template="portal/_job_summary.html",
            context=_job_context(membership, job_id),
        )
    return redirect("portal:job-detail", job_id)


def _download_name(job_id: int, stream: str) -> str:
    return f"job-{job_id}.{'out' if stream == 'stdout' else 'err'}"


@with_membership
def job_output_download(
    request: AuthenticatedHttpRequest, membership: Membership, job_id: int, stream: str
) -> HttpResponseBase:
    """The whole of one stream as it is now, read from the job's agent a chunk at a time
    (up to the size it had at the first chunk: a job that keeps writing does not keep
    the download open)."""
    organization = membership.organization
    limit = int(settings.API_OUTPUT_MAX_BYTES)
    try:
        first = job_output(
            organization=organization, job_id=job_id, stream=stream, offset=0, limit=limit
        )
    except JobOutputUnavailable as exc:
        return render(
            request,
            "portal/output_unavailable.html",
            {"message": exc.message, "job_id": job_id},
            status=503,
        )

    # An async iterator: the ASGI server sends each chunk as it comes (Django would read a
    # sync iterator whole into memory before sending any of it there).
    read = sync_to_async(job_output)

    async def chunks() -> AsyncIterator[bytes]:
        chunk, end = first, int(first["size"])
        yield str(chunk["data"]).encode()
        while chunk["data"] and int(chunk["next_offset"]) < end:
            offset = int(chunk["next_offset"])
            try:
                chunk = await read(
                    organization=organization,
                    job_id=job_id,
                    stream=stream,
                    offset=offset,
                    limit=min(limit, end - offset),
                )
            except (Http404, JobOutputUnavailable):  # its node went away: the file ends here
                return
            yield str(chunk["data"]).encode()

    response = StreamingHttpResponse(chunks(), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{_download_name(job_id, stream)}"'
    response["Cache-Control"] = "no-store"
    return response


def launch_choices() -> tuple[list[str], list[dict[str, Any]], str]:
    """GPU models of the cluster's nodes, its partitions, and why they are missing."""
    try:
        nodes, partitions = cluster_nodes(), cluster_partitions()
    except RpcError as exc:
        return [], [], scheduler_read_error(exc)
    return gpu_models(nodes), list(partitions), ""


def render_launch(
    request: AuthenticatedHttpRequest,
    membership: Membership,
    models: list[str],
    partitions: list[dict[str, Any]],
    unavailable: str,
    *,
    form: LaunchForm | None = None,
    session_form: SessionLaunchForm | None = None,
    estimate: Any = None,
) -> HttpResponse:
    """The launch page: the batch form with its cost estimate and prices, and the
    session launcher (session_views.py)."""
    names = [str(p["name"]) for p in partitions]
    response = render(
        request,
        "portal/launch.html",
        {
            "form": form or LaunchForm(gpu_models=models, partitions=names),
            "session_form": session_form or SessionLaunchForm(gpu_models=models),
            "unavailable": unavailable,
            "billing_role": not membership.runs_jobs,
            "estimate": estimate,
            "price_list": price_list(models),
        },
    )
    refused = (form, session_form)
    if any(getattr(f, "payment_required", False) for f in refused if f is not None):
        response.status_code = 402  # Payment Required: the refusal's message is on the form
    return response


def submit_from_form(
    request: AuthenticatedHttpRequest,
    membership: Membership,
    form: LaunchForm | SessionLaunchForm,
) -> dict[str, Any] | None:
    """Submits a valid launch form's job (a batch job's, or a session's) through the
    service every path uses; the job object, or None with each refusal put on the form
    where it belongs: the scheduler's on the field it names, the rest above the form."""
    try:
        return services.submit_job(
            organization=membership.organization,
            user=request.user,
            spec=form.spec(),
            idempotency_key=form.cleaned_data["idempotency_key"],
        )
    except JobRejected as exc:
        form.add_scheduler_error(exc.field, exc.message)
    except PermissionDenied as exc:
        form.add_error(None, str(exc))
    except PaymentRequired as exc:  # credit used up, or short of the estimate
        form.add_error(None, exc.message)
        form.payment_required = True  # the page answers 402, as the API does
    except RpcError as exc:  # the controller's refusal ("Requested node configuration...")
        form.add_error(None, scheduler_message(exc))
    return None


@with_membership
def launch(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    models, partitions, unavailable = launch_choices()
    names = [str(p["name"]) for p in partitions]
    form = LaunchForm(request.POST or None, gpu_models=models, partitions=names)
    estimate = None
    if request.method == "POST" and form.is_valid():
        estimate = quote(form, partitions=partitions)
    if request.method == "POST" and form.is_valid() and "estimate" not in request.POST:
        job = submit_from_form(request, membership, form)
        if job is not None:
            messages.success(request, f"Submitted batch job {job['job_id']}.")
            return redirect("portal:job-detail", int(job["job_id"]))
    return render_launch(
        request, membership, models, partitions, unavailable, form=form, estimate=estimate
    )
