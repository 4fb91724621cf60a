"""Changing a member's role (`tenants.services.change_member_role`): owners change any
role, admins any but an owner's and never to owner, nobody else any; an organisation
keeps an owner; each change is in the audit log, and a refusal changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied

from spurcloud.tenants.models import AuditEvent, Membership
from spurcloud.tenants.services import (
    LAST_OWNER_MESSAGE,
    OWNER_ROLE_MESSAGE,
    ROLE_MANAGERS_MESSAGE,
    add_member,
    change_member_role,
)
from tests.spurcloud.conftest import Tenant, make_user

ROLE = Membership.Role


@pytest.fixture
def people(acme: Tenant, globex: Tenant) -> dict[str, Any]:
    admin, billing = make_user("ada"), make_user("bill")
    add_member(organization=acme.organization, user=admin, role=ROLE.ADMIN, by=acme.owner)
    add_member(organization=acme.organization, user=billing, role=ROLE.BILLING, by=acme.owner)
    return {
        "owner": acme.owner,
        "admin": admin,
        "member": acme.member,
        "billing": billing,
        "outsider": globex.owner,
    }


def _role(acme: Tenant, user: Any) -> str:
    return Membership.objects.get(organization=acme.organization, user=user).role


def _change(acme: Tenant, people: dict[str, Any], by: str, whom: str, role: str) -> Membership:
    return change_member_role(
        organization=acme.organization, user=people[whom], role=role, by=people[by]
    )


def _role_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=AuditEvent.Action.MEMBER_ROLE_CHANGED))


@pytest.mark.parametrize("by", ["owner", "admin"])
def test_owners_and_admins_change_a_members_role_and_the_log_says_so(
    by: str, acme: Tenant, people: dict[str, Any]
) -> None:
    changed = _change(acme, people, by, "member", ROLE.BILLING)
    assert changed.role == ROLE.BILLING == _role(acme, acme.member)
    (event,) = _role_events()
    assert (event.actor, event.target, event.data) == (
        people[by],
        "max",
        {"from": "member", "to": "billing"},
    )
    assert event.organization == acme.organization


def test_an_owner_makes_another_owner_who_may_then_unmake_the_first(
    acme: Tenant, people: dict[str, Any]
) -> None:
    _change(acme, people, "owner", "admin", ROLE.OWNER)
    _change(acme, people, "admin", "owner", ROLE.MEMBER)  # ada, an owner now
    assert (_role(acme, people["admin"]), _role(acme, acme.owner)) == ("owner", "member")
    assert len(_role_events()) == 2


@pytest.mark.parametrize(
    ("whom", "role"),
    [("member", ROLE.OWNER), ("owner", ROLE.MEMBER), ("owner", ROLE.ADMIN), ("admin", ROLE.OWNER)],
)
def test_an_admin_neither_makes_nor_unmakes_an_owner(
    whom: str, role: str, acme: Tenant, people: dict[str, Any]
) -> None:
    before = _role(acme, people[whom])
    with pytest.raises(PermissionDenied, match=OWNER_ROLE_MESSAGE):
        _change(acme, people, "admin", whom, role)
    assert _role(acme, people[whom]) == before and not _role_events()


@pytest.mark.parametrize("by", ["member", "billing"])
def test_members_and_billing_change_no_role_not_even_their_own(
    by: str, acme: Tenant, people: dict[str, Any]
) -> None:
    for whom in ("admin", by):
        with pytest.raises(PermissionDenied, match=ROLE_MANAGERS_MESSAGE):
            _change(acme, people, by, whom, ROLE.ADMIN)
    assert _role(acme, people[by]) == by and not _role_events()


def test_an_outsider_changes_no_role_and_no_outsider_gets_one(
    acme: Tenant, people: dict[str, Any]
) -> None:
    with pytest.raises(PermissionDenied, match="Not a member"):
        _change(acme, people, "outsider", "member", ROLE.ADMIN)
    with pytest.raises(PermissionDenied, match="Not a member"):
        _change(acme, people, "owner", "outsider", ROLE.ADMIN)
    assert not Membership.objects.filter(
        organization=acme.organization, user=people["outsider"]
    ).exists()
    assert _role(acme, acme.member) == "member"


def test_the_last_owner_stays_an_owner(acme: Tenant, people: dict[str, Any]) -> None:
    with pytest.raises(PermissionDenied, match="An organisation needs an owner"):
        _change(acme, people, "owner", "owner", ROLE.ADMIN)
    assert LAST_OWNER_MESSAGE.startswith("An organisation needs an owner")
    assert _role(acme, acme.owner) == "owner" and not _role_events()


def test_an_admin_may_step_down_and_setting_the_same_role_records_nothing(
    acme: Tenant, people: dict[str, Any]
) -> None:
    _change(acme, people, "admin", "member", ROLE.MEMBER)
    assert not _role_events()
    _change(acme, people, "admin", "admin", ROLE.MEMBER)
    assert _role(acme, people["admin"]) == "member" and len(_role_events()) == 1


def test_an_unknown_role_is_refused(acme: Tenant, people: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown role 'root'"):
        _change(acme, people, "owner", "member", "root")
    assert _role(acme, acme.member) == "member"
