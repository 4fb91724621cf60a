"""Pages for the site's operators (staff): the cluster's nodes with drain and resume, and
every organisation's queue. Anyone else is refused (403) with the reason. Writes go
through `jobs.nodes` (drain_node, resume_node), which checks the same thing again."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from scheduler.core.commands import MAX_NODE_REASON
from scheduler.rpc.errors import NotFound, Refused, RpcError
from spurcloud.jobs.nodes import drain_node, resume_node
from spurcloud.jobs.selectors import cluster_nodes, cluster_queue
from spurcloud.portal.job_views import scheduler_read_error
from spurcloud.portal.membership import AuthenticatedHttpRequest

QUEUE_ROWS = 500


class DrainForm(forms.Form):
    reason = forms.CharField(
        max_length=MAX_NODE_REASON,
        label="Reason",
        help_text="Why, for everyone who reads the node list (sinfo -R).",
    )


def _require_staff(request: AuthenticatedHttpRequest) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("These pages are for the site's operators (staff).")


@login_required
def operator_nodes(request: AuthenticatedHttpRequest) -> HttpResponse:
    _require_staff(request)
    error = ""
    try:
        nodes = cluster_nodes(operator=True)
    except RpcError as exc:
        nodes, error = [], scheduler_read_error(exc)
    return render(
        request,
        "portal/operator_nodes.html",
        {"nodes": nodes, "error": error, "drain_form": DrainForm()},
    )


@require_POST
@login_required
def operator_node_drain(request: AuthenticatedHttpRequest, node: str) -> HttpResponse:
    _require_staff(request)
    form = DrainForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Node {node} not drained: a drain needs a reason.")
        return redirect("portal:operator-nodes")
    return _change(request, node, drain=form.cleaned_data["reason"])


@require_POST
@login_required
def operator_node_resume(request: AuthenticatedHttpRequest, node: str) -> HttpResponse:
    _require_staff(request)
    return _change(request, node, drain=None)


def _change(request: AuthenticatedHttpRequest, node: str, *, drain: str | None) -> HttpResponse:
    try:
        if drain is None:
            resume_node(user=request.user, node=node)
            messages.success(request, f"Node {node} resumed: it takes jobs again.")
        else:
            drain_node(user=request.user, node=node, reason=drain)
            messages.success(request, f"Node {node} drained: it takes no new job.")
    except NotFound as exc:
        raise Http404(exc.message) from exc
    except Refused as exc:  # the controller's words (the reason's bounds)
        messages.error(request, f"Node {node}: {exc.message}")
    except RpcError as exc:  # the scheduler cannot be reached
        messages.error(request, f"Node {node}: {scheduler_read_error(exc)}")
    return redirect("portal:operator-nodes")


@login_required
def operator_queue(request: AuthenticatedHttpRequest) -> HttpResponse:
    _require_staff(request)
    error = ""
    try:
        jobs = cluster_queue(limit=QUEUE_ROWS + 1)
    except RpcError as exc:
        jobs, error = [], scheduler_read_error(exc)
    return render(
        request,
        "portal/operator_queue.html",
        {"jobs": jobs[:QUEUE_ROWS], "more": len(jobs) > QUEUE_ROWS, "error": error},
    )
