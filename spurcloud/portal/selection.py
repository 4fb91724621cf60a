"""Which organisation the portal is showing: kept in the session, always re-checked
against the user's memberships (a removed member loses it on the next request)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spurcloud.tenants.models import Membership
from spurcloud.tenants.selectors import access_membership, memberships_of

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.base import SessionBase

SESSION_KEY = "spur_organization_id"


def selected_membership(*, user: User, session: SessionBase) -> Membership | None:
    """The membership of the selected organisation, falling back to the user's first."""
    return memberships_and_selected(user=user, session=session)[1]


def memberships_and_selected(
    *, user: User, session: SessionBase
) -> tuple[list[Membership], Membership | None]:
    """All the user's memberships (by organisation slug, each with its organisation: the
    page header's switch lists them) and the selected one among them, in one query."""
    memberships = list(memberships_of(user=user).order_by("organization__slug"))
    try:
        selected = int(session.get(SESSION_KEY))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        selected = None
    for membership in memberships:
        if membership.organization_id == selected:
            return memberships, membership
    if not memberships:
        return memberships, None
    session[SESSION_KEY] = memberships[0].organization_id
    return memberships, memberships[0]


def select_organization(*, user: User, session: SessionBase, organization_id: int) -> None:
    membership = access_membership(user=user, organization_id=organization_id)
    session[SESSION_KEY] = membership.organization_id
