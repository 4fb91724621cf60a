"""Who may sign up (SIGNUP_MODE: open, verified, invite, closed), invitations, and what a
user who has not confirmed their email may not do where confirmation is required."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from spurcloud.jobs.services import submit_job
from spurcloud.tenants.models import ApiToken, Invitation, Membership
from spurcloud.tenants.services import accept_invitation, create_api_token, create_invitation
from tests.spurcloud.conftest import Tenant, make_user

User = get_user_model()

SIGNUP = "/accounts/signup/"
PASSWORD = "a long passphrase 42"


@pytest.fixture
def signup_mode(settings: Any) -> Any:
    """Sets SIGNUP_MODE, and the email verification that settings.py derives from it."""

    def set_mode(mode: str) -> None:
        settings.SIGNUP_MODE = mode
        confirming = mode in ("verified", "invite")
        settings.ACCOUNT_EMAIL_VERIFICATION = "mandatory" if confirming else "optional"

    return set_mode


def _sign_up(browser: Client, email: str = "newbie@example.com") -> Any:
    return browser.post(SIGNUP, {"email": email, "password1": PASSWORD, "password2": PASSWORD})


def _sign_in(browser: Client, email: str) -> Any:
    return browser.post("/accounts/login/", {"login": email, "password": PASSWORD}, follow=True)


def _confirmation_link(message: Any) -> str:
    match = re.search(r"https?://[^/\s]+(/accounts/confirm-email/[^\s]+/)", message.body)
    assert match, message.body
    return match.group(1)


def _invite(tenant: Tenant, email: str = "newbie@example.com", role: str = "member") -> str:
    """The path of a new invitation link, as its owner's page shows it."""
    browser = Client()
    browser.force_login(tenant.owner)
    response = browser.post("/invitations/", {"email": email, "role": role})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    link = response.context["link"]
    assert link.startswith("http://testserver/invitations/accept/")
    return str(link.removeprefix("http://testserver"))


# -- open ---------------------------------------------------------------------------------


def test_in_open_mode_anyone_signs_up_and_is_signed_in_at_once(db: None, signup_mode: Any) -> None:
    signup_mode("open")
    browser = Client()
    response = _sign_up(browser)
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert browser.get("/")["Location"] == "/organizations/new"  # signed in, no organisation yet


def test_in_open_mode_an_unconfirmed_user_may_hold_a_token(acme: Tenant, signup_mode: Any) -> None:
    signup_mode("open")
    EmailAddress.objects.filter(user=acme.member).update(verified=False)
    create_api_token(user=acme.member, organization=acme.organization, name="cli")


# -- verified (the default) ---------------------------------------------------------------


def test_verified_is_the_default_and_makes_confirmation_mandatory(settings: Any) -> None:
    assert settings.SIGNUP_MODE == "verified"
    assert settings.ACCOUNT_EMAIL_VERIFICATION == "mandatory"


def test_in_verified_mode_a_new_account_signs_in_only_after_confirming(db: None) -> None:
    browser = Client()
    response = _sign_up(browser)
    assert response.status_code == 302
    assert response["Location"] == "/accounts/confirm-email/"
    assert not EmailAddress.objects.get(email="newbie@example.com").verified
    assert len(mail.outbox) == 1

    refused = _sign_in(Client(), "newbie@example.com")
    assert refused.redirect_chain[-1][0] == "/accounts/confirm-email/"
    assert b"Jobs of" not in refused.content

    link = _confirmation_link(mail.outbox[0])
    assert browser.post(link).status_code == 302
    assert EmailAddress.objects.get(email="newbie@example.com").verified
    signed_in = _sign_in(Client(), "newbie@example.com")
    assert signed_in.redirect_chain[-1][0] == "/organizations/new"


def test_an_unconfirmed_user_cannot_create_an_api_token(acme: Tenant) -> None:
    EmailAddress.objects.filter(user=acme.member).update(verified=False)
    with pytest.raises(PermissionDenied, match="Confirm your email"):
        create_api_token(user=acme.member, organization=acme.organization, name="cli")


@pytest.mark.parametrize("who", ["owner", "member"])
def test_the_token_page_tells_an_unconfirmed_user_why_there_is_no_form(
    who: str, acme: Tenant
) -> None:
    user = getattr(acme, who)
    EmailAddress.objects.filter(user=user).update(verified=False)
    browser = Client()
    browser.force_login(user)
    page = browser.get("/tokens/").content.decode()
    assert 'id="confirm-email"' in page
    assert "Confirm your email address first" in page
    assert "Create token" not in page
    browser.post("/tokens/", {"name": "sneaky", "scopes": ["read"], "expires_in_days": "30"})
    assert not ApiToken.objects.filter(user=user).exists()


def test_a_token_of_a_user_whose_email_is_unconfirmed_is_refused(acme: Tenant) -> None:
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="cli")
    # e.g. the address was changed and the new one is not confirmed yet
    EmailAddress.objects.filter(user=acme.member).update(verified=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = client.get("/api/v1/jobs")
    assert response.status_code == 401
    assert response.json()["detail"].startswith("Confirm your email address first")


def test_an_unconfirmed_user_cannot_submit_a_job(acme: Tenant) -> None:
    EmailAddress.objects.filter(user=acme.member).update(verified=False)
    with pytest.raises(PermissionDenied, match="Confirm your email"):
        submit_job(organization=acme.organization, user=acme.member, spec={"script": "#!/bin/sh\n"})


# -- invite -------------------------------------------------------------------------------


def test_in_invite_mode_there_is_no_sign_up_without_an_invitation(
    db: None, signup_mode: Any
) -> None:
    signup_mode("invite")
    page = Client().get(SIGNUP)
    assert b"by invitation only" in page.content
    assert b'name="password1"' not in page.content
    assert b">Sign up<" not in Client().get("/accounts/login/").content.split(b"<main>")[0]
    _sign_up(Client())
    assert not User.objects.filter(email="newbie@example.com").exists()


@pytest.mark.parametrize("role", ["member", "admin"])
def test_an_invitation_link_lets_one_person_sign_up_and_join(
    role: str, acme: Tenant, signup_mode: Any
) -> None:
    signup_mode("invite")
    link = _invite(acme, role=role)
    browser = Client()
    opened = browser.get(link)
    assert opened.status_code == 302
    assert opened["Location"] == f"{SIGNUP}?email=newbie%40example.com"
    form = browser.get(opened["Location"])
    assert b'value="newbie@example.com"' in form.content  # filled in from the invitation

    response = _sign_up(browser)
    assert response.status_code == 302
    user = User.objects.get(email="newbie@example.com")
    membership = Membership.objects.get(user=user)
    assert (membership.organization, membership.role) == (acme.organization, role)
    invitation = Invitation.objects.get()
    assert invitation.accepted_by == user and invitation.accepted_at is not None
    assert Client().get(link).status_code == 404  # used up

    # The link proves nothing about the address (its maker has the link too): it is
    # confirmed by mail, as any other, before the account signs in.
    assert response["Location"] == "/accounts/confirm-email/"
    assert not EmailAddress.objects.get(user=user).verified
    browser.post(_confirmation_link(mail.outbox[-1]))
    assert b"Active jobs of Acme" in _sign_in(Client(), "newbie@example.com").content


def test_an_invitation_lets_its_holder_sign_up_with_another_address_to_confirm(
    acme: Tenant, signup_mode: Any
) -> None:
    signup_mode("invite")
    browser = Client()
    browser.get(_invite(acme))
    response = _sign_up(browser, email="someone-else@example.com")
    assert response["Location"] == "/accounts/confirm-email/"
    user = User.objects.get(email="someone-else@example.com")
    assert Membership.objects.filter(user=user, organization=acme.organization).exists()
    assert [(a.email, a.verified) for a in EmailAddress.objects.filter(user=user)] == [
        ("someone-else@example.com", False)
    ]


def test_two_sign_ups_cannot_share_one_invitation(acme: Tenant, signup_mode: Any) -> None:
    signup_mode("invite")
    link = _invite(acme)
    first, second = Client(), Client()
    first.get(link)
    second.get(link)  # both opened it before either signed up
    assert _sign_up(first).status_code == 302
    refused = _sign_up(second, email="second@example.com")
    assert refused.status_code in (200, 403)
    assert not User.objects.filter(email="second@example.com").exists()
    assert Membership.objects.filter(organization=acme.organization).count() == 3


def test_an_invitation_serves_once_even_when_raced(acme: Tenant) -> None:
    invitation, _ = create_invitation(
        organization=acme.organization, email="a@x.org", by=acme.owner
    )
    stale = Invitation.objects.get(pk=invitation.pk)
    accept_invitation(invitation=invitation, user=make_user("first"))
    with pytest.raises(PermissionDenied):
        accept_invitation(invitation=stale, user=make_user("second"))


def test_an_expired_invitation_link_is_not_found(acme: Tenant, signup_mode: Any) -> None:
    signup_mode("invite")
    link = _invite(acme)
    Invitation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert Client().get(link).status_code == 404
    assert Client().get("/invitations/accept/not-a-real-secret").status_code == 404


def test_a_signed_in_user_opening_an_invitation_is_told_to_sign_out_first(
    acme: Tenant, globex: Tenant
) -> None:
    link = _invite(acme)
    browser = Client()
    browser.force_login(globex.member)
    response = browser.get(link, follow=True)
    assert response.redirect_chain[-1][0] == "/invitations/join"
    assert b"sign out and open the link again" in response.content
    assert not Membership.objects.filter(user=globex.member, organization=acme.organization)


def test_the_owner_invites_and_sees_the_organisations_invitations(acme: Tenant) -> None:
    _invite(acme, email="first@example.com")
    browser = Client()
    browser.force_login(acme.owner)
    page = browser.get("/invitations/").content.decode()
    assert "first@example.com" in page and "open until" in page
    assert 'href="/invitations/"' in page  # in the navigation, for owners and admins


def test_a_member_cannot_invite(acme: Tenant) -> None:
    browser = Client()
    browser.force_login(acme.member)
    assert browser.get("/invitations/").status_code == 403
    assert browser.post("/invitations/", {"email": "x@example.com"}).status_code == 403
    assert 'href="/invitations/"' not in browser.get("/").content.decode()
    assert not Invitation.objects.exists()
    with pytest.raises(PermissionDenied):
        create_invitation(organization=acme.organization, email="x@example.com", by=acme.member)


def test_an_outsider_neither_sees_nor_makes_the_organisations_invitations(
    acme: Tenant, globex: Tenant
) -> None:
    _invite(acme, email="acme-only@example.com")
    browser = Client()
    browser.force_login(globex.owner)
    page = browser.get("/invitations/").content.decode()
    assert "Invite people to Globex" in page
    assert "acme-only@example.com" not in page
    with pytest.raises(PermissionDenied):
        create_invitation(organization=acme.organization, email="x@example.com", by=globex.owner)


# -- closed -------------------------------------------------------------------------------


def test_in_closed_mode_there_is_no_sign_up_page(db: None, signup_mode: Any) -> None:
    signup_mode("closed")
    page = Client().get(SIGNUP)
    assert page.status_code == 404
    assert b'name="password1"' not in page.content
    assert _sign_up(Client()).status_code == 404
    assert not User.objects.filter(email="newbie@example.com").exists()
    assert (
        b'href="/accounts/signup/"'
        not in Client().get("/accounts/login/").content.split(b"<main>")[0]
    )


def test_in_closed_mode_an_invitation_opens_no_sign_up(acme: Tenant, signup_mode: Any) -> None:
    signup_mode("closed")
    browser = Client()
    browser.get(_invite(acme))
    assert _sign_up(browser).status_code == 404
    assert not User.objects.filter(email="newbie@example.com").exists()
