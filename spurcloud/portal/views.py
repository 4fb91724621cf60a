"""Server-rendered portal pages. Thin: each calls a selector or a service."""

from __future__ import annotations

from allauth.account.adapter import get_adapter
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from scheduler.rpc.errors import RpcError
from spurcloud.jobs import jobobject
from spurcloud.jobs.models import ACTIVE_STATES
from spurcloud.jobs.selectors import cluster_nodes, job_history
from spurcloud.portal.catalog import DashboardCatalog, gpu_catalog, kept_catalog
from spurcloud.portal.forms import ApiTokenForm, InvitationForm, OrganizationForm
from spurcloud.portal.job_rows import ROW_FIELDS, job_rows
from spurcloud.portal.job_views import scheduler_read_error
from spurcloud.portal.launch_quote import price_list
from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.portal.selection import select_organization
from spurcloud.portal.sessions import QOS, template_key
from spurcloud.tenants.adapter import remember_invitation
from spurcloud.tenants.models import Invitation, Membership
from spurcloud.tenants.selectors import (
    UNCONFIRMED_EMAIL_MESSAGE,
    access_api_token,
    access_invitation,
    api_tokens_of,
    audit_events_of,
    email_confirmed,
    invitations_of,
)
from spurcloud.tenants.services import (
    create_api_token,
    create_invitation,
    create_organization,
    revoke_api_token,
)

DASHBOARD_JOBS = 20
DASHBOARD_EVENTS = 10


def _read_catalog() -> DashboardCatalog:
    try:
        kinds = gpu_catalog(cluster_nodes(operator=True))
    except RpcError as exc:
        return DashboardCatalog(kinds=[], prices={}, error=scheduler_read_error(exc))
    prices = {r["model"]: r for r in price_list([k.model for k in kinds])}
    return DashboardCatalog(kinds=kinds, prices=prices, error="")


@with_membership
def dashboard(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    """What a renter needs first: which GPUs are free now, their organisation's active
    jobs (live), what happened lately, and how to start when nothing has yet."""
    organization = membership.organization
    active = job_history(organization=organization, states=ACTIVE_STATES)
    jobs = [
        jobobject.from_values(r, tenant=organization.slug, fields=ROW_FIELDS)
        for r in jobobject.history_values(active.order_by("-job_id"), ROW_FIELDS)[:DASHBOARD_JOBS]
    ]
    # Its active sessions (one query: the interactive QoS, then the sessions' comment);
    # a session is an active job, so there is none to look for when no job is active.
    sessions = [
        {"job_id": r.job_id, "state": r.state, "template": key, "nodes": r.nodes}
        for r in (active.filter(qos=QOS).order_by("-job_id")[:DASHBOARD_JOBS] if jobs else ())
        if (key := template_key(r.spec)) is not None
    ]
    catalog = kept_catalog(
        (tuple(settings.SPUR_CONTROLLER_URLS), settings.SPUR_CLUSTER_TOKEN), _read_catalog
    )
    # Owners and admins see everyone's actions; members their own.
    actor = None if membership.manages_organization else request.user
    return render(
        request,
        "portal/dashboard.html",
        {
            "rows": job_rows(jobs),
            "sessions": sessions,
            "catalog": catalog.kinds,
            "prices": catalog.prices,
            "catalog_error": catalog.error,
            "activity": audit_events_of(organization=organization, actor=actor)[:DASHBOARD_EVENTS],
            # An organisation with an active job has had a job.
            "first_run": not jobs and not job_history(organization=organization).exists(),
            "api_url": request.build_absolute_uri("/").rstrip("/"),
            "live_poll": settings.SPUR_JOBS_POLL_INTERVAL_S > 0,
        },
    )


@with_membership
def tokens(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    organization = membership.organization
    new_secret = ""
    staff = request.user.is_staff
    # Until the user confirms their email (where that is required) the page says so and
    # offers no form: the service would refuse the token anyway.
    confirmed = email_confirmed(user=request.user)
    form = ApiTokenForm(request.POST or None, staff=staff)
    if request.method == "POST" and confirmed and form.is_valid():
        try:
            # The secret goes into this one answer and nowhere else (no redirect, no session).
            _, new_secret = create_api_token(
                user=request.user,
                organization=organization,
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                expires_at=form.expires_at(),
            )
        except (PermissionDenied, ValueError) as exc:
            form.add_error(None, str(exc))
        else:
            form = ApiTokenForm(staff=staff)
    response = render(
        request,
        "portal/tokens.html",
        {
            "form": form,
            "new_secret": new_secret,
            "email_confirmed": confirmed,
            "unconfirmed_message": UNCONFIRMED_EMAIL_MESSAGE,
            "now": timezone.now(),
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
    # Staff see what operators see (agent URLs, GPUs in use); tenants what the API shows them.
    operator = request.user.is_staff
    error = ""
    try:
        node_list = cluster_nodes(operator=operator)
    except RpcError as exc:
        node_list, error = [], scheduler_read_error(exc)
    return render(
        request, "portal/nodes.html", {"nodes": node_list, "error": error, "operator": operator}
    )


@with_membership
def invitations(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    if not membership.manages_organization:
        raise PermissionDenied("Only the organisation's owners and admins can invite.")
    organization = membership.organization
    link = ""
    form = InvitationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        invitation, secret = create_invitation(
            organization=organization,
            email=form.cleaned_data["email"],
            role=form.cleaned_data["role"],
            by=request.user,
        )
        # Like a token's secret, the link is in this answer and the invitee's email only.
        link = request.build_absolute_uri(reverse("portal:invitation-accept", args=[secret]))
        send_invitation_email(request, invitation=invitation, link=link)
        messages.success(request, f"Invitation sent to {invitation.email}.")
        form = InvitationForm()
    response = render(
        request,
        "portal/invitations.html",
        {
            "form": form,
            "link": link,
            "now": timezone.now(),
            "invitations": invitations_of(organization=organization)[:100],
        },
    )
    if link:
        response["Cache-Control"] = "no-store"
    return response


def send_invitation_email(request: HttpRequest, *, invitation: Invitation, link: str) -> None:
    """The invitation link by email, through allauth's adapter (its mail settings and
    sender, as for sign-up confirmations)."""
    inviter = request.user.email or request.user.get_username()  # type: ignore[union-attr]
    get_adapter(request).send_mail(
        "portal/email/invitation",
        invitation.email,
        {
            "inviter": inviter,
            "organization": invitation.organization,
            "role": invitation.get_role_display().lower(),
            "expires_at": invitation.expires_at,
            "link": link,
        },
    )


@never_cache
def invitation_accept(request: HttpRequest, secret: str) -> HttpResponse:
    """The invitation link: carries the invitation into sign-up, or (signed in, or signing
    in from the sign-up page) to the page where an existing account joins (404 when it is
    used, expired or unknown, the same page for each)."""
    invitation = access_invitation(secret=secret)
    remember_invitation(request, invitation)
    if request.user.is_authenticated:
        return redirect("portal:invitation-join")
    # The sign-up form, its address filled in (allauth reads `email` from the query).
    return redirect(f"{reverse('account_signup')}?{urlencode({'email': invitation.email})}")


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
