"""Template context: the organisation the portal shows, and the others the user can pick;
whether a visitor may sign up."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from spurcloud.portal.selection import selected_membership
from spurcloud.tenants.adapter import signup_allowed
from spurcloud.tenants.selectors import memberships_of


def current_organization(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or request.path.startswith("/admin/"):
        return {}
    membership = getattr(request, "spur_membership", None) or selected_membership(
        user=user, session=request.session
    )
    return {
        "membership": membership,
        "organization": membership.organization if membership else None,
        "memberships": list(memberships_of(user=user).order_by("organization__slug")),
    }


def signup(request: HttpRequest) -> dict[str, Any]:
    """Whether to offer a visitor the sign-up link (SIGNUP_MODE; in invite mode, only to
    one who opened an invitation)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return {}
    return {"signup_allowed": signup_allowed(request)}
