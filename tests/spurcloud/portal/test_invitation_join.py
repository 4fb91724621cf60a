"""An invitation taken by an existing account (portal/invitation_join.py): after signing
in from the link, or already signed in; only for an account whose confirmed address the
invitation names, never twice, never changing a member's role."""

from __future__ import annotations

import pytest
from allauth.account.models import EmailAddress
from django.test import Client

from spurcloud.tenants.models import Invitation, Membership
from spurcloud.tenants.services import create_invitation
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import browser

PASSWORD = "correct horse battery"  # make_user's


def _link(tenant: Tenant, email: str, role: str = "member") -> str:
    _, secret = create_invitation(
        organization=tenant.organization, email=email, role=role, by=tenant.owner
    )
    return f"/invitations/accept/{secret}"


def test_an_existing_account_signs_in_from_the_link_and_joins(acme: Tenant, globex: Tenant) -> None:
    link = _link(acme, "GINA@example.com", role="admin")  # addresses match in any case
    visitor = Client()
    # The link leads to sign-up; the visitor has an account, so signs in instead.
    assert visitor.get(link)["Location"].startswith("/accounts/signup/")
    signed_in = visitor.post(
        "/accounts/login/", {"login": "gina@example.com", "password": PASSWORD}, follow=True
    )
    assert signed_in.redirect_chain[-1][0] == "/invitations/join"
    assert "Join Acme as gina@example.com" in signed_in.content.decode()

    joined = visitor.post("/invitations/join", follow=True)
    assert joined.redirect_chain[-1][0] == "/"
    assert "You joined Acme as Admin." in joined.content.decode()
    assert "Active jobs of Acme" in joined.content.decode()  # the organisation it shows now
    membership = Membership.objects.get(user=globex.member, organization=acme.organization)
    assert membership.role == Membership.Role.ADMIN
    invitation = Invitation.objects.get()
    assert invitation.accepted_by == globex.member
    # Used up: the link and the join page are gone.
    assert visitor.get(link).status_code == 404
    assert visitor.get("/invitations/join").status_code == 404


def test_a_signed_in_account_opening_the_link_is_offered_to_join(
    acme: Tenant, globex: Tenant
) -> None:
    client = browser(globex.member)
    opened = client.get(_link(acme, "gina@example.com"), follow=True)
    assert opened.redirect_chain[-1][0] == "/invitations/join"
    client.post("/invitations/join")
    assert Membership.objects.filter(user=globex.member, organization=acme.organization).exists()


def test_an_account_without_the_invited_address_cannot_take_it(
    acme: Tenant, globex: Tenant
) -> None:
    client = browser(globex.member)
    page = client.get(_link(acme, "someone@example.com"), follow=True).content.decode()
    assert "This invitation is for someone@example.com" in page
    assert "sign out and open the link again" in page
    assert "<button" not in page.split('id="invitation-refusal"')[1].split("</section>")[0]
    refused = client.post("/invitations/join", follow=True).content.decode()
    assert "This invitation is for someone@example.com" in refused
    assert not Membership.objects.filter(user=globex.member, organization=acme.organization)
    assert Invitation.objects.get().accepted_at is None


def test_an_unconfirmed_address_does_not_count(acme: Tenant, globex: Tenant) -> None:
    EmailAddress.objects.filter(user=globex.member).update(verified=False)
    client = browser(globex.member)
    client.get(_link(acme, "gina@example.com"))
    client.post("/invitations/join")
    assert not Membership.objects.filter(user=globex.member, organization=acme.organization)


@pytest.mark.parametrize("who", ["owner", "member"])
def test_a_member_is_not_invited_again_nor_their_role_changed(who: str, acme: Tenant) -> None:
    user = getattr(acme, who)
    before = Membership.objects.get(user=user, organization=acme.organization).role
    client = browser(user)
    page = client.get(_link(acme, user.email, role="billing"), follow=True).content.decode()
    assert "You are already a member of Acme." in page
    client.post("/invitations/join")
    assert Membership.objects.get(user=user, organization=acme.organization).role == before


def test_the_join_page_needs_a_signed_in_user_with_an_open_invitation(
    acme: Tenant, globex: Tenant
) -> None:
    anonymous = Client().get("/invitations/join")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    assert browser(globex.member).get("/invitations/join").status_code == 404
    client = browser(globex.member)
    client.get(_link(acme, "gina@example.com"))
    Invitation.objects.update(accepted_at="2026-01-01T00:00:00Z")  # used meanwhile
    assert client.post("/invitations/join").status_code == 404
    assert not Membership.objects.filter(user=globex.member, organization=acme.organization)


def test_signing_in_without_an_invitation_goes_to_the_dashboard(globex: Tenant) -> None:
    done = Client().post(
        "/accounts/login/", {"login": "gina@example.com", "password": PASSWORD}, follow=True
    )
    assert done.redirect_chain[-1][0] == "/"
