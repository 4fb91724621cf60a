"""Which organisation the portal is showing: kept in the session, always re-checked
against the user's memberships (a removed member loses it on the next request)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.http import Http404

from spurcloud.tenants.models import Membership
from spurcloud.tenants.selectors import access_membership, memberships_of

SESSION_KEY = "spur_organization_id"


def selected_membership(*, user: AbstractBaseUser, session: Any) -> Membership | None:
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


def select_organization(*, user: AbstractBaseUser, session: Any, organization_id: int) -> None:
    membership = access_membership(user=user, organization_id=organization_id)
    session[SESSION_KEY] = membership.organization_id
