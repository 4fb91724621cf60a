"""Which organisation the portal is showing: kept in the session, always re-checked
against the user's memberships (a removed member loses it on the next request)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import Http404

from spurcloud.tenants.models import Membership
from spurcloud.tenants.selectors import access_membership, memberships_of

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.base import SessionBase

SESSION_KEY = "spur_organization_id"


def selected_membership(*, user: User, session: SessionBase) -> Membership | None:
    """The membership of the selected organisation, falling back to the user's first."""
    organization_id = session.get(SESSION_KEY)
    if organization_id is not None:
        try:
            return access_membership(user=user, organization_id=int(organization_id))
        except (Http404, TypeError, ValueError):
            pass
    membership = memberships_of(user=user).order_by("organization__slug").first()
    if membership is not None:
        session[SESSION_KEY] = membership.organization_id
    return membership


def select_organization(*, user: User, session: SessionBase, organization_id: int) -> None:
    membership = access_membership(user=user, organization_id=organization_id)
    session[SESSION_KEY] = membership.organization_id
