"""An existing account takes an invitation: the invitation link (views.invitation_accept)
keeps the invitation in the session, and this page, reached at once when signed in or
right after signing in (tenants.adapter.get_login_redirect_url), offers to join, or says
why this account may not (tenants.selectors.invitation_refusal)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache

from spurcloud.portal.membership import AuthenticatedHttpRequest
from spurcloud.portal.selection import select_organization
from spurcloud.tenants.adapter import INVITATION_SESSION_KEY, pending_invitation
from spurcloud.tenants.selectors import invitation_refusal
from spurcloud.tenants.services import join_by_invitation


@never_cache
@login_required
def invitation_join(request: AuthenticatedHttpRequest) -> HttpResponse:
    invitation = pending_invitation(request)
    if invitation is None:
        raise Http404("There is no open invitation to join: it was used, or has expired.")
    if request.method == "POST":
        try:
            membership = join_by_invitation(invitation=invitation, user=request.user)
        except PermissionDenied as exc:
            messages.error(request, str(exc))
        else:
            request.session.pop(INVITATION_SESSION_KEY, None)
            select_organization(
                user=request.user,
                session=request.session,
                organization_id=membership.organization_id,
            )
            messages.success(
                request,
                f"You joined {invitation.organization.name} as {membership.get_role_display()}.",
            )
            return redirect("portal:dashboard")
    return render(
        request,
        "portal/invitation_signed_in.html",
        {
            "invitation": invitation,
            "refusal": invitation_refusal(invitation=invitation, user=request.user),
        },
    )
