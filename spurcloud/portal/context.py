"""Template context: the organisation the portal shows, and the others the user can pick;
whether a visitor may sign up."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from spurcloud.portal.selection import memberships_and_selected
from spurcloud.tenants.adapter import signup_allowed


def current_organization(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or request.path.startswith("/admin/"):
        return {}
    # A portal page (`with_membership`) has read them already.
    membership = getattr(request, "spur_membership", None)
    memberships = getattr(request, "spur_memberships", None)
    if membership is None or memberships is None:
        memberships, membership = memberships_and_selected(user=user, session=request.session)
    return {
        "membership": membership,
        "organization": membership.organization if membership else None,
        "memberships": memberships,
    }


def signup(request: HttpRequest) -> dict[str, Any]:
    """Whether to offer a visitor the sign-up link (SIGNUP_MODE; in invite mode, only to
    one who opened an invitation)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return {}
    return {"signup_allowed": signup_allowed(request)}
