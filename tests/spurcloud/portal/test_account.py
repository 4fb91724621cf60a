"""The account page (portal/account_views.py): SSH public keys (added with their
fingerprint, bounded, removed; each person sees and removes only their own), and
two-factor authentication through allauth.mfa: once TOTP is on, signing in needs a code."""

from __future__ import annotations

import time
from typing import Any

import pytest
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import format_hotp_value, hotp_value
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.core.cache import cache
from django.test import Client

from spurcloud.tenants.models import MAX_SSH_KEYS_PER_USER, SshKey
from spurcloud.tenants.services import add_ssh_key
from spurcloud.tenants.sshkeys import parse_public_key
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import EVERYONE, browser
from tests.spurcloud.test_sshkeys import openssh_line

PASSWORD = "correct horse battery"  # make_user's


def new_key(comment: str = "me@laptop") -> str:
    return openssh_line(ed25519.Ed25519PrivateKey.generate(), comment)


@pytest.mark.parametrize("who", EVERYONE)
def test_everyone_adds_sees_and_removes_their_own_keys(who: str, people: dict[str, Any]) -> None:
    user = people[who]
    client = browser(user)
    line = new_key("work laptop")
    added = client.post("/account/", {"name": "", "public_key": line}, follow=True)
    page = added.content.decode()
    fingerprint = parse_public_key(line).fingerprint
    assert f"SSH key work laptop added ({fingerprint})." in page
    assert f"<code>{fingerprint}</code>" in page and "ssh-ed25519 (256 bits)" in page
    key = SshKey.objects.get(user=user)
    assert key.public_key == line.rsplit(" ", 2)[0]  # stored without the comment

    # Nobody else sees it or can remove it (the same 404 as a missing key).
    other = people["outsider" if who != "outsider" else "owner"]
    assert fingerprint not in browser(other).get("/account/").content.decode()
    assert browser(other).post(f"/account/ssh-keys/{key.pk}/remove").status_code == 404
    assert SshKey.objects.filter(pk=key.pk).exists()

    removed = client.post(f"/account/ssh-keys/{key.pk}/remove", follow=True)
    assert "SSH key work laptop removed." in removed.content.decode()
    assert not SshKey.objects.filter(user=user).exists()


def test_a_bad_key_is_refused_on_the_form(acme: Tenant) -> None:
    page = browser(acme.member).post("/account/", {"name": "x", "public_key": "ssh-dss AAAA"})
    assert page.status_code == 200
    assert "Key type &#x27;ssh-dss&#x27; is not accepted" in page.content.decode()
    assert not SshKey.objects.exists()


def test_a_key_is_held_once_and_an_account_holds_a_bounded_number(acme: Tenant) -> None:
    line = new_key()
    add_ssh_key(user=acme.member, name="a", public_key=line)
    again = browser(acme.member).post("/account/", {"name": "b", "public_key": line})
    assert "is already on your account" in again.content.decode()
    # Another person may hold the same public key (a shared machine's, say).
    add_ssh_key(user=acme.owner, name="a", public_key=line)
    for _ in range(MAX_SSH_KEYS_PER_USER - 1):
        add_ssh_key(user=acme.member, name="k", public_key=new_key())
    full = browser(acme.member).post("/account/", {"name": "c", "public_key": new_key()})
    assert f"at most {MAX_SSH_KEYS_PER_USER} SSH keys" in full.content.decode()
    assert SshKey.objects.filter(user=acme.member).count() == MAX_SSH_KEYS_PER_USER


def test_nobody_signed_in_is_sent_to_sign_in(db: None) -> None:
    assert Client().get("/account/")["Location"].startswith("/accounts/login/")
    assert Client().post("/account/ssh-keys/1/remove")["Location"].startswith("/accounts/login/")


def test_the_account_page_links_to_two_factor_and_sessions(acme: Tenant) -> None:
    page = browser(acme.member).get("/account/").content.decode()
    assert 'href="/accounts/2fa/"' in page and "Turn on two-factor authentication" in page
    assert 'href="/accounts/sessions/"' in page


def _sign_in(client: Client, email: str) -> Any:
    return client.post("/accounts/login/", {"login": email, "password": PASSWORD}, follow=True)


def _code(secret: str) -> str:
    return format_hotp_value(hotp_value(secret, int(time.time()) // 30))


def test_once_totp_is_on_signing_in_needs_a_code(acme: Tenant) -> None:
    client = browser(acme.member)
    # Turning it on asks for the password again (allauth's reauthentication).
    assert client.get("/accounts/2fa/totp/activate/")["Location"].startswith(
        "/accounts/reauthenticate/"
    )
    client.post("/accounts/reauthenticate/", {"password": PASSWORD})
    activate = client.get("/accounts/2fa/totp/activate/")
    assert activate.status_code == 200
    secret = activate.context["form"].secret
    page = activate.content.decode()
    assert secret in page and 'src="data:image/svg+xml;base64,' in page  # key, and QR code
    done = client.post("/accounts/2fa/totp/activate/", {"code": _code(secret)}, follow=True)
    assert done.status_code == 200
    assert Authenticator.objects.filter(user=acme.member, type="totp").exists()
    assert "Manage two-factor" in client.get("/account/").content.decode()
    client.post("/accounts/logout/")

    # The password alone is not enough: the sign-in stops at the code.
    visitor = Client()
    stage = _sign_in(visitor, "max@example.com")
    assert stage.redirect_chain[-1][0] == "/accounts/2fa/authenticate/"
    assert visitor.get("/")["Location"].startswith("/accounts/login/")
    wrong = visitor.post("/accounts/2fa/authenticate/", {"code": "000000"})
    assert wrong.status_code == 200 and b"Incorrect code" in wrong.content
    assert visitor.get("/")["Location"].startswith("/accounts/login/")
    # A code serves once (allauth remembers used ones for their period): the activation's
    # code may still be the current one, so forget it, as the next period would.
    cache.clear()
    signed_in = visitor.post("/accounts/2fa/authenticate/", {"code": _code(secret)}, follow=True)
    assert signed_in.redirect_chain[-1][0] == "/"
    assert b"Active jobs of Acme" in signed_in.content


def test_the_signed_in_sessions_are_listed_and_others_can_be_signed_out(acme: Tenant) -> None:
    laptop, phone = Client(HTTP_USER_AGENT="laptop-browser"), Client(HTTP_USER_AGENT="phone")
    _sign_in(laptop, "max@example.com")
    _sign_in(phone, "max@example.com")
    page = laptop.get("/accounts/sessions/")
    assert page.context["session_count"] == 2
    assert b"laptop-browser" in page.content and b"phone" in page.content
    laptop.post("/accounts/sessions/")  # sign out the other sessions
    assert phone.get("/")["Location"].startswith("/accounts/login/")
    assert laptop.get("/").status_code == 200


def _turn_on_totp(client: Client, user: Any) -> str:
    """TOTP on through allauth's own pages (after the password again); its secret."""
    client.post("/accounts/reauthenticate/", {"password": PASSWORD})
    secret = str(client.get("/accounts/2fa/totp/activate/").context["form"].secret)
    client.post("/accounts/2fa/totp/activate/", {"code": _code(secret)})
    assert Authenticator.objects.filter(user=user, type="totp").exists()
    cache.clear()  # the activation's code is used; the next period's would be fresh
    return secret


def test_recovery_codes_are_generated_and_one_signs_in_once_in_place_of_a_code(
    acme: Tenant,
) -> None:
    client = browser(acme.member)
    _turn_on_totp(client, acme.member)
    # New codes (allauth asks for the password again first, within its timeout): the old
    # ones, made with TOTP, stop working.
    first = client.get("/accounts/2fa/recovery-codes/").context["unused_codes"]
    generated = client.post("/accounts/2fa/recovery-codes/generate/", follow=True)
    assert generated.redirect_chain[-1][0] == "/accounts/2fa/recovery-codes/"
    codes = list(generated.context["unused_codes"])
    assert len(codes) == 10 and set(codes).isdisjoint(first)
    assert "or one of your recovery codes" in client.get("/account/").content.decode()
    client.post("/accounts/logout/")

    visitor = Client()
    assert _sign_in(visitor, "max@example.com").redirect_chain[-1][0] == (
        "/accounts/2fa/authenticate/"
    )
    old = visitor.post("/accounts/2fa/authenticate/", {"code": first[0]})
    assert old.status_code == 200 and b"Incorrect code" in old.content
    signed_in = visitor.post("/accounts/2fa/authenticate/", {"code": codes[0]}, follow=True)
    assert signed_in.redirect_chain[-1][0] == "/"
    assert b"Active jobs of Acme" in signed_in.content
    visitor.post("/accounts/logout/")

    # A recovery code serves once.
    again = Client()
    _sign_in(again, "max@example.com")
    used = again.post("/accounts/2fa/authenticate/", {"code": codes[0]})
    assert used.status_code == 200 and b"Incorrect code" in used.content
    assert again.get("/")["Location"].startswith("/accounts/login/")
    assert again.post("/accounts/2fa/authenticate/", {"code": codes[1]}).status_code == 302
