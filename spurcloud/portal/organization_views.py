"""The organisation page: its members and their roles, changing a role, removing one,
leaving, and (for owners and admins) the organisation's audit log, read-only.
Invitations have their own page (views.invitations). Every change goes through
`tenants.services` (`change_member_role`, `remove_member`), which hold the rules (who
may change or remove whom, an owner stays).

With htmx, a member's action answers with the members' card alone (spurcloud/portal/
htmx.py); a change to one's own membership reloads the page, whose every part it changes."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from spurcloud.portal.htmx import fragment, is_htmx
from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.tenants.models import Membership
from spurcloud.tenants.selectors import access_member, audit_events_of, members_of
from spurcloud.tenants.services import change_member_role, remove_member

EVENTS_PER_PAGE = 50
MEMBERS_FRAGMENT = "portal/_members.html"


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices)


def roles_offered(actor: Membership, target: Membership) -> list[tuple[str, str]]:
    """The roles `actor` may give `target` (empty: none), as `change_member_role` allows:
    an owner any, an admin any but owner and never an owner's."""
    owner = Membership.Role.OWNER
    if not actor.manages_organization:
        return []
    if actor.role == owner:
        return list(Membership.Role.choices)
    if target.role == owner:
        return []
    return [(value, label) for value, label in Membership.Role.choices if value != owner]


def _members_context(membership: Membership) -> dict[str, Any]:
    members = list(members_of(organization=membership.organization))
    return {"members": [(m, roles_offered(membership, m)) for m in members]}


@with_membership
def organization(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    org = membership.organization
    audit = None
    if membership.manages_organization:
        audit = Paginator(audit_events_of(organization=org), EVENTS_PER_PAGE).get_page(
            request.GET.get("page")
        )
    return render(
        request, "portal/organization.html", {**_members_context(membership), "audit": audit}
    )


def _after_member_change(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    if is_htmx(request):
        return fragment(request, MEMBERS_FRAGMENT, _members_context(membership))
    return redirect("portal:organization")


@require_POST
@with_membership
def member_role(
    request: AuthenticatedHttpRequest, membership: Membership, membership_id: str
) -> HttpResponse:
    target = access_member(organization=membership.organization, membership_id=int(membership_id))
    form = MemberRoleForm(request.POST)
    name = target.user.email or target.user.get_username()
    if not form.is_valid():
        messages.error(request, f"{name}: choose one of the roles.")
        return _after_member_change(request, membership)
    try:
        changed = change_member_role(
            organization=membership.organization,
            user=target.user,
            role=form.cleaned_data["role"],
            by=request.user,
        )
    except PermissionDenied as exc:
        messages.error(request, str(exc))
        return _after_member_change(request, membership)
    messages.success(request, f"{name} is now {changed.get_role_display().lower()}.")
    if target.user_id == request.user.pk:  # the viewer's own role: every part may change
        return redirect("portal:organization")
    return _after_member_change(request, membership)


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
        return _after_member_change(request, membership)
    if leaving:
        messages.success(request, f"You left {membership.organization.name}.")
        return redirect("portal:dashboard")
    name = target.user.email or target.user.get_username()
    messages.success(request, f"{name} is no longer a member.")
    return _after_member_change(request, membership)
