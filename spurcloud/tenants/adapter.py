"""Who may sign up (settings.SIGNUP_MODE), through allauth's own hook, and what an
invitation does at sign-up.

- open, verified: anyone; verified makes allauth's email confirmation mandatory, and
  the API and the services refuse an unconfirmed user (tenants.selectors.email_confirmed).
- invite: only a visitor who opened an invitation link (portal `invitation_accept`,
  which keeps the invitation's id in the session); the address still needs confirming.
  The link proves nothing about an address: whoever made the invitation has it too, and
  a link taken for proof would let them make "confirmed" accounts for any address.
- closed: there is no sign-up page; operators make the accounts.

In any mode an invitation carried into sign-up makes the new user a member, once. One
opened by someone who then signs in instead (an existing account) is offered to them
after signing in (`get_login_redirect_url`: the portal's invitation-join page).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from django.shortcuts import render
from django.urls import reverse

from spurcloud.tenants.models import Invitation
from spurcloud.tenants.selectors import open_invitation
from spurcloud.tenants.services import accept_invitation

if TYPE_CHECKING:
    from django.contrib.auth.models import User

INVITATION_SESSION_KEY = "spur_invitation_id"


def remember_invitation(request: HttpRequest, invitation: Invitation) -> None:
    """Carries the invitation into the sign-up that follows."""
    request.session[INVITATION_SESSION_KEY] = invitation.pk


def pending_invitation(request: HttpRequest) -> Invitation | None:
    """The invitation this visitor opened, while it is still open."""
    invitation_id = request.session.get(INVITATION_SESSION_KEY)
    if not isinstance(invitation_id, int):
        return None
    return open_invitation(invitation_id=invitation_id)


def signup_allowed(request: HttpRequest) -> bool:
    """Whether this visitor may sign up now (templates hide the link otherwise)."""
    mode = settings.SIGNUP_MODE
    if mode == "closed":
        return False
    if mode == "invite":
        return pending_invitation(request) is not None
    return True


class AccountAdapter(DefaultAccountAdapter):  # type: ignore[misc]  # allauth ships no types
    def is_open_for_signup(self, request: HttpRequest) -> bool:
        if settings.SIGNUP_MODE == "closed":
            # Not "sign-up is closed for now": there is no such page on this site.
            raise ImmediateHttpResponse(
                render(request, "account/signup_closed.html", {"signup_mode": "closed"}, status=404)
            )
        return signup_allowed(request)

    def get_login_redirect_url(self, request: HttpRequest) -> str:
        if pending_invitation(request) is not None:
            return reverse("portal:invitation-join")
        url: str = super().get_login_redirect_url(request)
        return url

    def save_user(self, request: HttpRequest, user: User, form: Any, commit: bool = True) -> User:
        invitation = pending_invitation(request)
        if invitation is None:
            saved: User = super().save_user(request, user, form, commit)
            return saved
        # One transaction: when the invitation was used meanwhile (another sign-up with
        # the same link), no account is left behind without its organisation.
        with transaction.atomic():
            saved = super().save_user(request, user, form, commit=True)
            accept_invitation(invitation=invitation, user=saved)
        request.session.pop(INVITATION_SESSION_KEY, None)
        return saved
