"""Writes to tenants: organisations, members and their roles, invitations, API tokens, SSH
keys. Each runs in one transaction and records an audit event inside it (an SSH key is a
person's, not an organisation's: there is no organisation's log for it)."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from spurcloud.tenants import tokens
from spurcloud.tenants.models import (
    DEFAULT_SCOPES,
    MAX_SSH_KEYS_PER_USER,
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Organization,
    Scope,
    SshKey,
    scopes_text,
)
from spurcloud.tenants.selectors import (
    UNCONFIRMED_EMAIL_MESSAGE,
    email_confirmed,
    invitation_refusal,
)
from spurcloud.tenants.sshkeys import InvalidSshKey, parse_public_key
from spurcloud.tenants.token_cache import forget_api_tokens

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# last_used_at is for people ("used 3 minutes ago"), so it need not cost a write per request.
TOKEN_TOUCH_INTERVAL = timedelta(seconds=60)


def record_audit_event(
    *,
    organization: Organization,
    actor: User | None,
    action: str,
    target: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        organization=organization, actor=actor, action=action, target=target, data=data or {}
    )


def _free_slug(base: str) -> str:
    base = (base or "org")[:40].strip("-") or "org"
    slug, n = base, 1
    while Organization.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


@transaction.atomic
def create_organization(*, name: str, owner: User, slug: str = "") -> Organization:
    """A new organisation with `owner` as its owner. Without a slug, one is made from the name
    (and made unique); a slug that is given must be free."""
    if slug:
        slug = slugify(slug)
        if not slug:
            raise ValueError("the slug must contain letters or digits")
    else:
        slug = _free_slug(slugify(name))
    organization = Organization.objects.create(name=name, slug=slug)
    Membership.objects.create(user=owner, organization=organization, role=Membership.Role.OWNER)
    record_audit_event(
        organization=organization,
        actor=owner,
        action=AuditEvent.Action.ORGANIZATION_CREATED,
        target=slug,
    )
    return organization


@transaction.atomic
def add_member(
    *,
    organization: Organization,
    user: User,
    role: str = Membership.Role.MEMBER,
    by: User | None = None,
) -> Membership:
    """Makes `user` a member with `role`; adding someone already there sets their role."""
    if role not in Membership.Role.values:
        raise ValueError(f"unknown role {role!r}")
    membership, created = Membership.objects.get_or_create(
        user=user, organization=organization, defaults={"role": role}
    )
    if not created and membership.role != role:
        membership.role = role
        membership.save(update_fields=["role"])
    record_audit_event(
        organization=organization,
        actor=by,
        action=AuditEvent.Action.MEMBER_ADDED,
        target=user.get_username(),
        data={"role": role},
    )
    return membership


@transaction.atomic
def create_api_token(
    *,
    user: User,
    organization: Organization,
    name: str,
    scopes: Iterable[str] = DEFAULT_SCOPES,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """A new token for `user` in `organization`, and its secret: the only time anyone sees it.
    Refused (PermissionDenied) to someone who is not a member, who has not confirmed their
    email where that is required, or who asks for the admin scope without being staff;
    ValueError for an unknown scope or an expiry in the past."""
    if not Membership.objects.filter(user=user, organization=organization).exists():
        raise PermissionDenied("Only members of an organisation can create its API tokens.")
    if not email_confirmed(user=user):
        raise PermissionDenied(UNCONFIRMED_EMAIL_MESSAGE)
    text = scopes_text(scopes)
    if Scope.ADMIN in text.split() and not user.is_staff:
        raise PermissionDenied("Only operators (staff) can create tokens with the admin scope.")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("the expiry must be in the future")
    secret = tokens.generate_secret()
    token = ApiToken.objects.create(
        user=user,
        organization=organization,
        name=name.strip() or "token",
        prefix=tokens.display_prefix(secret),
        token_hash=tokens.hash_secret(secret),
        scopes=text,
        expires_at=expires_at,
    )
    record_audit_event(
        organization=organization,
        actor=user,
        action=AuditEvent.Action.TOKEN_CREATED,
        target=token.prefix,
        data={
            "name": token.name,
            "scopes": text,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    return token, secret


@transaction.atomic
def revoke_api_token(*, token: ApiToken, by: User | None = None) -> bool:
    """Revokes the token; False when it was already revoked (revoking twice is harmless)."""
    now = timezone.now()
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    transaction.on_commit(forget_api_tokens)  # this process refuses it at once
    if revoked:
        token.revoked_at = now
        record_audit_event(
            organization=token.organization,
            actor=by,
            action=AuditEvent.Action.TOKEN_REVOKED,
            target=token.prefix,
            data={"name": token.name},
        )
    return bool(revoked)


def touch_api_token(*, token: ApiToken) -> None:
    """Notes that the token was used, at most once a minute (a conditional UPDATE, so
    concurrent requests do not pile up writes)."""
    now = timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < TOKEN_TOUCH_INTERVAL:
        return
    ApiToken.objects.filter(pk=token.pk).exclude(
        last_used_at__gte=now - TOKEN_TOUCH_INTERVAL
    ).update(last_used_at=now)
    token.last_used_at = now


@transaction.atomic
def create_invitation(
    *, organization: Organization, email: str, role: str = Membership.Role.MEMBER, by: User
) -> tuple[Invitation, str]:
    """An invitation to join `organization` with `role` (admin, member or billing), made by one of
    its owners or admins, and its secret (for the link): the only time anyone sees it."""
    membership = Membership.objects.filter(user=by, organization=organization).first()
    if membership is None or not membership.manages_organization:
        raise PermissionDenied("Only the organisation's owners and admins can invite.")
    if role not in (Membership.Role.ADMIN, Membership.Role.MEMBER, Membership.Role.BILLING):
        raise ValueError(f"an invitation's role is admin, member or billing, not {role!r}")
    secret = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        organization=organization,
        email=email.strip(),
        role=role,
        token_hash=tokens.hash_secret(secret),
        created_by=by,
        expires_at=timezone.now() + timedelta(days=settings.INVITATION_TTL_DAYS),
    )
    record_audit_event(
        organization=organization,
        actor=by,
        action=AuditEvent.Action.MEMBER_INVITED,
        target=invitation.email,
        data={"role": role},
    )
    return invitation, secret


@transaction.atomic
def accept_invitation(*, invitation: Invitation, user: User) -> Membership:
    """Makes `user` a member as the invitation says. An invitation serves once: it is
    claimed with a conditional UPDATE, so two sign-ups racing on one link cannot both
    join (the second gets PermissionDenied)."""
    now = timezone.now()
    claimed = Invitation.objects.filter(
        pk=invitation.pk, accepted_at__isnull=True, expires_at__gt=now
    ).update(accepted_at=now, accepted_by=user)
    if not claimed:
        raise PermissionDenied("This invitation has been used or has expired.")
    invitation.accepted_at, invitation.accepted_by = now, user
    return add_member(
        organization=invitation.organization,
        user=user,
        role=invitation.role,
        by=invitation.created_by,
    )


@transaction.atomic
def join_by_invitation(*, invitation: Invitation, user: User) -> Membership:
    """An existing account takes an invitation to one of its confirmed addresses (sign-up
    takes it in `AccountAdapter.save_user`). Refused with PermissionDenied, saying why
    (`invitation_refusal`), or when the invitation was used meanwhile."""
    refusal = invitation_refusal(invitation=invitation, user=user)
    if refusal:
        raise PermissionDenied(refusal)
    return accept_invitation(invitation=invitation, user=user)


LAST_OWNER_MESSAGE = (
    "An organisation needs an owner: make someone else its owner before the last one goes."
)


def _locked_memberships(organization: Organization) -> dict[int, Membership]:
    """The organisation's memberships by user, locked in primary-key order: two changes
    at once (two owners leaving, one demoting the other) cannot both pass the check that
    an owner stays."""
    return {
        m.user_id: m
        for m in Membership.objects.select_for_update()
        .filter(organization=organization)
        .order_by("pk")
    }


ROLE_MANAGERS_MESSAGE = "Only the organisation's owners and admins can change roles."
OWNER_ROLE_MESSAGE = "Only an owner can make or unmake an owner."


@transaction.atomic
def change_member_role(
    *, organization: Organization, user: User, role: str, by: User
) -> Membership:
    """Gives `user` (a member) the role `role`, as `by`, one of the organisation's owners
    or admins: an admin neither makes an owner nor changes an owner's role; the last
    owner stays an owner. Refused with PermissionDenied (ValueError for an unknown role),
    changing nothing; setting the role someone has changes nothing either, and records
    nothing. Jobs keep running: what the new role may do is checked on each request."""
    if role not in Membership.Role.values:
        raise ValueError(f"unknown role {role!r}")
    memberships = _locked_memberships(organization)
    target, actor = memberships.get(user.pk), memberships.get(by.pk)
    if target is None or actor is None:
        raise PermissionDenied("Not a member of this organisation.")
    if not actor.manages_organization:
        raise PermissionDenied(ROLE_MANAGERS_MESSAGE)
    if target.role == role:
        return target
    owner = Membership.Role.OWNER
    if owner in (target.role, role) and actor.role != owner:
        raise PermissionDenied(OWNER_ROLE_MESSAGE)
    owners = [m for m in memberships.values() if m.role == owner]
    if target.role == owner and len(owners) == 1:
        raise PermissionDenied(LAST_OWNER_MESSAGE)
    previous, target.role = target.role, role
    target.save(update_fields=["role"])
    record_audit_event(
        organization=organization,
        actor=by,
        action=AuditEvent.Action.MEMBER_ROLE_CHANGED,
        target=user.get_username(),
        data={"from": previous, "to": role},
    )
    return target


@transaction.atomic
def remove_member(*, organization: Organization, user: User, by: User) -> None:
    """Ends `user`'s membership: `by` is the user (leaving), or one of the organisation's
    owners or admins (an admin removes no owner). The last owner cannot go. Their API
    tokens of this organisation are revoked with it, so that joining again later does not
    bring old secrets back to life. Refused with PermissionDenied.

    The organisation's memberships are locked (in primary-key order) first, so two owners
    leaving at once cannot both pass the last-owner check."""
    memberships = _locked_memberships(organization)
    target, actor = memberships.get(user.pk), memberships.get(by.pk)
    if target is None or actor is None:
        raise PermissionDenied("Not a member of this organisation.")
    if by.pk != user.pk:
        if not actor.manages_organization:
            raise PermissionDenied("Only the organisation's owners and admins can remove members.")
        if target.role == Membership.Role.OWNER and actor.role != Membership.Role.OWNER:
            raise PermissionDenied("Only an owner can remove an owner.")
    owners = [m for m in memberships.values() if m.role == Membership.Role.OWNER]
    if target.role == Membership.Role.OWNER and len(owners) == 1:
        raise PermissionDenied(LAST_OWNER_MESSAGE)
    target.delete()
    now = timezone.now()
    ApiToken.objects.filter(organization=organization, user=user, revoked_at__isnull=True).update(
        revoked_at=now
    )
    transaction.on_commit(forget_api_tokens)
    record_audit_event(
        organization=organization,
        actor=by,
        action=AuditEvent.Action.MEMBER_REMOVED,
        target=user.get_username(),
        data={"role": target.role, "left": by.pk == user.pk},
    )


@transaction.atomic
def add_ssh_key(*, user: User, name: str, public_key: str) -> SshKey:
    """Adds a public key to `user`'s account: InvalidSshKey (a ValueError) saying why a
    key is refused (its format, type or size, `sshkeys.parse_public_key`; already there;
    the account holds MAX_SSH_KEYS_PER_USER). The user's row is locked first, so two
    additions at once cannot both pass the count."""
    parsed = parse_public_key(public_key)
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    keys = SshKey.objects.filter(user=user)
    if keys.filter(fingerprint=parsed.fingerprint).exists():
        raise InvalidSshKey(f"This key ({parsed.fingerprint}) is already on your account.")
    if keys.count() >= MAX_SSH_KEYS_PER_USER:
        raise InvalidSshKey(
            f"An account holds at most {MAX_SSH_KEYS_PER_USER} SSH keys: remove one first."
        )
    return SshKey.objects.create(
        user=user,
        name=(name.strip() or parsed.comment or parsed.key_type)[:100],
        key_type=parsed.key_type,
        public_key=parsed.line,
        fingerprint=parsed.fingerprint,
        bits=parsed.bits,
    )


def remove_ssh_key(*, key: SshKey) -> None:
    SshKey.objects.filter(pk=key.pk).delete()
