"""Server-rendered portal pages. Thin: each calls a selector or a service."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Concatenate, ParamSpec

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from scheduler.rpc.errors import Unavailable
from spurcloud.jobs import jobobject
from spurcloud.jobs.selectors import cluster_nodes, job_history
from spurcloud.portal.forms import ApiTokenForm, OrganizationForm
from spurcloud.portal.selection import select_organization, selected_membership
from spurcloud.tenants.models import Membership
from spurcloud.tenants.selectors import access_api_token, api_tokens_of
from spurcloud.tenants.services import create_api_token, create_organization, revoke_api_token

if TYPE_CHECKING:
    from django.contrib.auth.models import User

DASHBOARD_JOBS = 100

_P = ParamSpec("_P")


class AuthenticatedHttpRequest(HttpRequest):
    """A request that `login_required` let through: its user is signed in. Under
    `with_membership` it also carries the membership chosen (the template context reads it)."""

    user: User
    spur_membership: Membership


def with_membership(
    view: Callable[Concatenate[AuthenticatedHttpRequest, Membership, _P], HttpResponse],
) -> Callable[Concatenate[AuthenticatedHttpRequest, _P], HttpResponse]:
    """Logged in, and a member of some organisation (else: create one first)."""

    @login_required
    @wraps(view)
    def wrapper(
        request: AuthenticatedHttpRequest, /, *args: _P.args, **kwargs: _P.kwargs
    ) -> HttpResponse:
        membership = selected_membership(user=request.user, session=request.session)
        if membership is None:
            return redirect("portal:organization-create")
        request.spur_membership = membership
        return view(request, membership, *args, **kwargs)

    return wrapper


@with_membership
def dashboard(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    organization = membership.organization
    records = job_history(organization=organization).order_by("-job_id")[:DASHBOARD_JOBS]
    jobs = [jobobject.from_record(r, tenant=organization.slug) for r in records]
    return render(
        request,
        "portal/dashboard.html",
        {"jobs": jobs, "live_poll": settings.SPUR_JOBS_POLL_INTERVAL_S > 0},
    )


@with_membership
def tokens(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    organization = membership.organization
    new_secret = ""
    form = ApiTokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        # The secret goes into this one answer and nowhere else (no redirect, no session).
        _, new_secret = create_api_token(
            user=request.user, organization=organization, name=form.cleaned_data["name"]
        )
        form = ApiTokenForm()
    response = render(
        request,
        "portal/tokens.html",
        {
            "form": form,
            "new_secret": new_secret,
            "tokens": api_tokens_of(user=request.user, organization=organization),
        },
    )
    if new_secret:
        response["Cache-Control"] = "no-store"
    return response


@require_POST
@with_membership
def token_revoke(
    request: AuthenticatedHttpRequest, membership: Membership, token_id: int
) -> HttpResponse:
    token = access_api_token(
        user=request.user, organization=membership.organization, token_id=token_id
    )
    if revoke_api_token(token=token, by=request.user):
        messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("portal:tokens")


@with_membership
def nodes(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    error = ""
    try:
        node_list = cluster_nodes()
    except Unavailable as exc:
        node_list, error = [], f"The scheduler is unreachable: {exc.message}"
    return render(request, "portal/nodes.html", {"nodes": node_list, "error": error})


@login_required
def organization_create(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = OrganizationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        organization = create_organization(name=form.cleaned_data["name"], owner=request.user)
        select_organization(
            user=request.user, session=request.session, organization_id=organization.pk
        )
        return redirect("portal:dashboard")
    return render(request, "portal/organization_create.html", {"form": form})


@require_POST
@login_required
def organization_select(request: AuthenticatedHttpRequest) -> HttpResponse:
    try:
        organization_id = int(request.POST.get("organization", ""))
    except ValueError:
        return redirect("portal:dashboard")
    select_organization(user=request.user, session=request.session, organization_id=organization_id)
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = "portal:dashboard"
    return redirect(target or "portal:dashboard")
