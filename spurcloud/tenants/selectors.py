"""Reads across the tenant boundary ("missing" and "not yours" raise the same 404), and
the facts about a user that decide what they may do (a confirmed email)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from allauth.account.models import EmailAddress
from django.conf import settings
from django.db.models import Case, Exists, IntegerField, OuterRef, QuerySet, Subquery, Value, When
from django.http import Http404
from django.utils import timezone

from spurcloud.tenants import tokens
from spurcloud.tenants.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Organization,
    SshKey,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django_stubs_ext import WithAnnotations

    class _TokenAnnotations(TypedDict):
        member_role: str | None
        email_confirmed: bool

    # An ApiToken as `api_token_for_secret` reads it, with its user's role in its
    # organisation (None: no longer a member) and whether the user confirmed an address.
    AnnotatedApiToken = WithAnnotations[ApiToken, _TokenAnnotations]


UNCONFIRMED_EMAIL_MESSAGE = (
    "Confirm your email address first (follow the link in the email we sent you): until "
    "then you cannot create API tokens, use them, or submit jobs."
)


def email_confirmation_required() -> bool:
    """Whether a user must have confirmed an email address before holding or using an API
    token (SIGNUP_MODE verified or invite, which make allauth's verification mandatory)."""
    return bool(settings.ACCOUNT_EMAIL_VERIFICATION == "mandatory")


def email_confirmed(*, user: User | AnonymousUser) -> bool:
    """The user has confirmed an address, or no confirmation is required."""
    if not email_confirmation_required():
        return True
    return bool(EmailAddress.objects.filter(user_id=user.pk, verified=True).exists())


def memberships_of(*, user: User) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("organization")


def access_membership(*, user: User, organization_id: int) -> Membership:
    """The user's membership of the organisation; 404 when there is none."""
    membership = (
        Membership.objects.filter(user=user, organization_id=organization_id)
        .select_related("organization")
        .first()
    )
    if membership is None:
        raise Http404("No such organisation.")
    return membership


def is_member(*, user: User, organization: Organization) -> bool:
    return Membership.objects.filter(user=user, organization=organization).exists()


def api_tokens_of(*, user: User, organization: Organization) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user, organization=organization)


def access_api_token(*, user: User, organization: Organization, token_id: int) -> ApiToken:
    token = (
        ApiToken.objects.filter(pk=token_id, user=user, organization=organization)
        .select_related("organization")
        .first()
    )
    if token is None:
        raise Http404("No such API token.")
    return token


def api_token_for_secret(secret: str) -> AnnotatedApiToken | None:
    """The token whose hash matches, revoked or not, with `user` and `organization` loaded,
    `member_role` (the user's role in the organisation, None when no longer a member) and
    `email_confirmed` annotated (a token outlives neither the user's membership nor the
    user's active flag, and serves only a confirmed address where that is required).
    One query."""
    if not tokens.looks_like_secret(secret):
        return None
    return (
        ApiToken.objects.filter(token_hash=tokens.hash_secret(secret))
        .select_related("user", "organization")
        .annotate(
            member_role=Subquery(
                Membership.objects.filter(
                    user=OuterRef("user"), organization=OuterRef("organization")
                ).values("role")[:1]
            ),
            email_confirmed=Exists(
                EmailAddress.objects.filter(user=OuterRef("user"), verified=True)
            ),
        )
        .first()
    )


def invitations_of(*, organization: Organization) -> QuerySet[Invitation]:
    return Invitation.objects.filter(organization=organization).select_related("accepted_by")


def access_invitation(*, secret: str) -> Invitation:
    """The open invitation (not used, not expired) with this secret; 404 otherwise, the
    same for every reason."""
    invitation = (
        Invitation.objects.filter(
            token_hash=tokens.hash_secret(secret),
            accepted_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
        .select_related("organization", "created_by")
        .first()
    )
    if invitation is None:
        raise Http404("This invitation is not valid: it was used, has expired, or never existed.")
    return invitation


def open_invitation(*, invitation_id: int) -> Invitation | None:
    """The invitation, while it is still open (the one a sign-up in progress carries)."""
    return (
        Invitation.objects.filter(
            pk=invitation_id, accepted_at__isnull=True, expires_at__gt=timezone.now()
        )
        .select_related("organization", "created_by")
        .first()
    )


def invitation_refusal(*, invitation: Invitation, user: User) -> str:
    """Why `user`, signed in, may not take `invitation` with this account ("" when they
    may): an account joins only by an invitation to one of its confirmed addresses (the
    link alone proves nothing about an address: its maker has it too), and never twice."""
    organization = invitation.organization
    if Membership.objects.filter(user=user, organization=organization).exists():
        return f"You are already a member of {organization.name}."
    if not EmailAddress.objects.filter(
        user_id=user.pk, email__iexact=invitation.email, verified=True
    ).exists():
        return (
            f"This invitation is for {invitation.email}, which is not a confirmed address of "
            f"the account you are signed in with ({user.email or user.get_username()}). Sign "
            "in with that address's account, add and confirm the address on this account, "
            "or sign out and open the link again to make a new account."
        )
    return ""


def audit_events_of(
    *, organization: Organization, actor: User | None = None
) -> QuerySet[AuditEvent]:
    """The organisation's audit trail, newest first; only `actor`'s own when given."""
    events = AuditEvent.objects.filter(organization=organization).select_related("actor")
    return events if actor is None else events.filter(actor=actor)


def members_of(*, organization: Organization) -> QuerySet[Membership]:
    """The organisation's memberships with their users: owners first, then by name."""
    rank = Case(
        *(When(role=role, then=Value(i)) for i, role in enumerate(Membership.Role.values)),
        output_field=IntegerField(),
    )
    return (
        Membership.objects.filter(organization=organization)
        .select_related("user")
        .order_by(rank, "user__username")
    )


def access_member(*, organization: Organization, membership_id: int) -> Membership:
    """A membership of the organisation; the same 404 for a missing one and another
    organisation's."""
    membership = members_of(organization=organization).filter(pk=membership_id).first()
    if membership is None:
        raise Http404("No such member.")
    return membership


def ssh_keys_of(*, user: User) -> QuerySet[SshKey]:
    return SshKey.objects.filter(user=user)


def access_ssh_key(*, user: User, key_id: int) -> SshKey:
    """The user's own key; 404 for another's and a missing one alike."""
    key = SshKey.objects.filter(user=user, pk=key_id).first()
    if key is None:
        raise Http404("No such SSH key.")
    return key
