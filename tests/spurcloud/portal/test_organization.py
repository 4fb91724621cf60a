"""The organisation page: members and roles, invitations by email, removing a member,
leaving; the audit log for owners and admins, read-only."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail

from spurcloud.tenants.models import ApiToken, AuditEvent, Invitation, Membership
from spurcloud.tenants.services import LAST_OWNER_MESSAGE, create_api_token
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import EVERYONE, ROLES, browser


def _membership(user: Any, tenant: Tenant) -> Membership:
    return Membership.objects.get(user=user, organization=tenant.organization)


@pytest.mark.parametrize("who", EVERYONE)
def test_each_sees_the_members_of_their_own_organisation_with_roles(
    who: str, people: dict[str, Any]
) -> None:
    page = browser(people[who]).get("/organization/").content.decode()
    if who == "outsider":
        assert "oscar@example.com" in page and "max@example.com" not in page
        return
    for email, role in (
        ("olivia", "Owner"),
        ("ada", "Admin"),
        ("max", "Member"),
        ("bill", "Billing"),
    ):
        assert f"<td>{email}@example.com" in page
        assert f"<td>{role}</td>" in page


@pytest.mark.parametrize("who", ROLES)
def test_owners_and_admins_read_the_audit_log_members_do_not(
    who: str, people: dict[str, Any]
) -> None:
    page = browser(people[who]).get("/organization/").content.decode()
    manager = who in ("owner", "admin")
    assert ("Audit log" in page) == manager
    if manager:
        assert "Organisation created" in page and "Member added" in page


def test_nobody_signed_in_is_sent_to_sign_in(db: None) -> None:
    response = browser(None).get("/organization/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("who", ["owner", "admin"])
def test_owners_and_admins_remove_a_member_whose_tokens_die_with_it(
    who: str, acme: Tenant, people: dict[str, Any]
) -> None:
    token, _ = create_api_token(user=acme.member, organization=acme.organization, name="x")
    target = _membership(acme.member, acme)
    response = browser(people[who]).post(f"/organization/members/{target.pk}/remove", follow=True)
    assert "max@example.com is no longer a member." in response.content.decode()
    assert not Membership.objects.filter(pk=target.pk).exists()
    token.refresh_from_db()
    assert token.revoked_at is not None
    event = AuditEvent.objects.get(action=AuditEvent.Action.MEMBER_REMOVED)
    assert (event.actor, event.target, event.data["left"]) == (people[who], "max", False)


@pytest.mark.parametrize(
    ("who", "whom", "message"),
    [
        ("member", "admin", "Only the organisation&#x27;s owners and admins can remove members."),
        ("billing", "member", "Only the organisation&#x27;s owners and admins can remove members."),
        ("admin", "owner", "Only an owner can remove an owner."),
    ],
)
def test_who_may_not_remove_is_told_why(
    who: str, whom: str, message: str, acme: Tenant, people: dict[str, Any]
) -> None:
    target = _membership(people[whom], acme)
    response = browser(people[who]).post(f"/organization/members/{target.pk}/remove", follow=True)
    assert message in response.content.decode()
    assert Membership.objects.filter(pk=target.pk).exists()


def test_an_outsider_gets_a_404(acme: Tenant, people: dict[str, Any]) -> None:
    target = _membership(acme.member, acme)
    client = browser(people["outsider"])
    assert client.post(f"/organization/members/{target.pk}/remove").status_code == 404
    assert client.post("/organization/members/999999/remove").status_code == 404
    assert client.post("/organization/members/" + "9" * 30 + "/remove").status_code == 404
    assert Membership.objects.filter(pk=target.pk).exists()


def test_a_member_leaves(acme: Tenant, people: dict[str, Any]) -> None:
    target = _membership(acme.member, acme)
    client = browser(acme.member)
    response = client.post(f"/organization/members/{target.pk}/remove")
    assert response["Location"] == "/"
    assert not Membership.objects.filter(pk=target.pk).exists()
    assert AuditEvent.objects.get(action=AuditEvent.Action.MEMBER_REMOVED).data["left"] is True
    assert client.get("/")["Location"] == "/organizations/new"  # in no organisation now


def test_the_last_owner_cannot_leave(acme: Tenant, people: dict[str, Any]) -> None:
    target = _membership(acme.owner, acme)
    response = browser(acme.owner).post(f"/organization/members/{target.pk}/remove", follow=True)
    assert LAST_OWNER_MESSAGE in response.content.decode().replace("&#x27;", "'")
    assert Membership.objects.filter(pk=target.pk).exists()


def test_removal_needs_a_post(acme: Tenant, people: dict[str, Any]) -> None:
    target = _membership(acme.member, acme)
    assert browser(acme.owner).get(f"/organization/members/{target.pk}/remove").status_code == 405


def test_an_invitation_is_sent_by_email_with_its_link(acme: Tenant, people: dict[str, Any]) -> None:
    response = browser(acme.owner).post(
        "/invitations/", {"email": "newcomer@example.org", "role": "member"}
    )
    assert response.status_code == 200
    link = response.context["link"]
    assert len(mail.outbox) == 1
    sent = mail.outbox[0]
    assert sent.to == ["newcomer@example.org"]
    assert "Acme" in sent.subject and link in sent.body
    assert (
        browser(None)
        .get(link.removeprefix("http://testserver"))["Location"]
        .startswith("/accounts/signup/")
    )
    assert ApiToken.objects.count() == 0


def test_an_invitation_may_give_the_billing_role(acme: Tenant, people: dict[str, Any]) -> None:
    response = browser(acme.owner).post(
        "/invitations/", {"email": "accounts@example.org", "role": "billing"}
    )
    assert response.status_code == 200
    assert Invitation.objects.get(email="accounts@example.org").role == "billing"
    assert "as billing" in mail.outbox[0].body


# -- changing a member's role -----------------------------------------------------------


def _role_form_of(page: str, membership: Membership) -> str:
    """The options of the role form for `membership` on the page ("" when it has none)."""
    start = page.find(f'action="/organization/members/{membership.pk}/role"')
    return page[start : page.find("</select>", start)] if start >= 0 else ""


@pytest.mark.parametrize(
    ("who", "offered"),
    [
        ("owner", {"owner": True, "admin": True, "member": True, "billing": True}),
        ("admin", {"owner": False, "admin": True, "member": True, "billing": True}),
        ("member", {"owner": False, "admin": False, "member": False, "billing": False}),
        ("billing", {"owner": False, "admin": False, "member": False, "billing": False}),
    ],
)
def test_the_page_offers_a_role_form_where_the_viewer_may_change_the_role(
    who: str, offered: dict[str, bool], acme: Tenant, people: dict[str, Any]
) -> None:
    page = browser(people[who]).get("/organization/").content.decode()
    for whom, form_expected in offered.items():
        form = _role_form_of(page, _membership(people[whom], acme))
        assert bool(form) == form_expected, whom
        if form:  # an owner may give the owner role; an admin may not
            assert ('<option value="owner"' in form) == (who == "owner")
            assert (
                f'<label class="visually-hidden" for="role-{_membership(people[whom], acme).pk}">'
                in page
            )


@pytest.mark.parametrize("who", ["owner", "admin"])
def test_owners_and_admins_change_a_role_from_the_page(
    who: str, acme: Tenant, people: dict[str, Any]
) -> None:
    target = _membership(acme.member, acme)
    response = browser(people[who]).post(
        f"/organization/members/{target.pk}/role", {"role": "admin"}, follow=True
    )
    assert response.redirect_chain == [("/organization/", 302)]
    assert "max@example.com is now admin." in response.content.decode()
    target.refresh_from_db()
    assert target.role == "admin"
    event = AuditEvent.objects.get(action=AuditEvent.Action.MEMBER_ROLE_CHANGED)
    assert (event.actor, event.data) == (people[who], {"from": "member", "to": "admin"})


@pytest.mark.parametrize(
    ("who", "whom", "role", "message"),
    [
        (
            "member",
            "billing",
            "admin",
            "Only the organisation&#x27;s owners and admins can change roles.",
        ),
        (
            "billing",
            "member",
            "admin",
            "Only the organisation&#x27;s owners and admins can change roles.",
        ),
        ("admin", "owner", "member", "Only an owner can make or unmake an owner."),
        ("admin", "member", "owner", "Only an owner can make or unmake an owner."),
        ("owner", "owner", "member", "An organisation needs an owner"),
        ("owner", "member", "root", "max@example.com: choose one of the roles."),
    ],
)
def test_who_may_not_change_a_role_is_told_why(
    who: str, whom: str, role: str, message: str, acme: Tenant, people: dict[str, Any]
) -> None:
    target = _membership(people[whom], acme)
    response = browser(people[who]).post(
        f"/organization/members/{target.pk}/role", {"role": role}, follow=True
    )
    assert message in response.content.decode()
    assert Membership.objects.get(pk=target.pk).role == target.role
    assert not AuditEvent.objects.filter(action=AuditEvent.Action.MEMBER_ROLE_CHANGED).exists()


def test_an_outsider_changes_no_role_and_the_change_needs_a_post(
    acme: Tenant, people: dict[str, Any]
) -> None:
    target = _membership(acme.member, acme)
    outsider = browser(people["outsider"])
    assert (
        outsider.post(f"/organization/members/{target.pk}/role", {"role": "admin"}).status_code
        == 404
    )
    assert browser(acme.owner).get(f"/organization/members/{target.pk}/role").status_code == 405
    assert (
        browser(None)
        .post(f"/organization/members/{target.pk}/role", {"role": "admin"})["Location"]
        .startswith("/accounts/login/")
    )
    assert Membership.objects.get(pk=target.pk).role == "member"
