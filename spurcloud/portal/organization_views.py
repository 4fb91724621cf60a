"""The organisation page: its members and their roles, removing one, leaving, and (for
owners and admins) the organisation's audit log, read-only. Invitations have their own
page (views.invitations). Every change goes through `tenants.services.remove_member`,
which holds the rules (who may remove whom, the last owner stays)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.tenants.models import Membership
from spurcloud.tenants.selectors import access_member, audit_events_of, members_of
from spurcloud.tenants.services import remove_member

EVENTS_PER_PAGE = 50


@with_membership
def organization(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    org = membership.organization
    audit = None
    if membership.manages_organization:
        audit = Paginator(audit_events_of(organization=org), EVENTS_PER_PAGE).get_page(
            request.GET.get("page")
        )
    return render(
        request,
        "portal/organization.html",
        {"members": members_of(organization=org), "audit": audit},
    )


@require_POST
@with_membership
def member_remove(
    request: AuthenticatedHttpRequest, membership: Membership, membership_id: str
) -> HttpResponse:
    target = access_member(organization=membership.organization, membership_id=int(membership_id))
    leaving = target.user_id == request.user.pk
    try:
        remove_member(organization=membership.organization, user=target.user, by=request.user)
    except PermissionDenied as exc:
        messages.error(request, str(exc))
        return redirect("portal:organization")
    if leaving:
        messages.success(request, f"You left {membership.organization.name}.")
        return redirect("portal:dashboard")
    name = target.user.email or target.user.get_username()
    messages.success(request, f"{name} is no longer a member.")
    return redirect("portal:organization")
