"""Organisations (the tenants), who belongs to them, their API tokens, and an audit trail."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q


class Organization(models.Model):
    """A tenant. Its slug is the tenant name the scheduler knows (and the default account)."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=50, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"
        BILLING = "billing", "Billing"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["organization_id", "user_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "organization"], name="membership_one_per_user_and_org"
            ),
            models.CheckConstraint(
                condition=Q(role__in=["owner", "admin", "member", "billing"]),
                name="membership_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"

    @property
    def manages_organization(self) -> bool:
        """Owners and admins act on everyone's jobs; members on their own."""
        return self.role in (self.Role.OWNER, self.Role.ADMIN)

    @property
    def runs_jobs(self) -> bool:
        return self.role_runs_jobs(self.role)

    @classmethod
    def role_runs_jobs(cls, role: str) -> bool:
        """Owners, admins and members submit and control jobs; a billing member sees the
        organisation (its jobs, members and bills) and runs nothing."""
        return role != cls.Role.BILLING


class Scope(models.TextChoices):
    """What an API token may do. Each API operation needs one (spurcloud/api/permissions.py)."""

    READ = "read", "read: jobs, their output, the queue, nodes and partitions"
    JOBS = "jobs", "jobs: submit jobs and act on them (cancel, hold, release, requeue)"
    ADMIN = "admin", "admin: operator-only operations (staff users only)"


# A token's scopes, space-separated in this order (OAuth's convention), e.g. "read jobs".
SCOPE_ORDER = [Scope.READ, Scope.JOBS, Scope.ADMIN]
DEFAULT_SCOPES = frozenset({Scope.READ, Scope.JOBS})
_ONE_SCOPE = "(" + "|".join(s.value for s in SCOPE_ORDER) + ")"


def scopes_text(scopes: Iterable[str]) -> str:
    """The stored form of a set of scopes; ValueError for one that does not exist."""
    wanted = set(scopes)
    unknown = wanted - set(Scope.values)
    if unknown:
        raise ValueError(f"unknown scope(s): {', '.join(sorted(unknown))}")
    if not wanted:
        raise ValueError("a token needs at least one scope")
    return " ".join(s.value for s in SCOPE_ORDER if s in wanted)


class ApiToken(models.Model):
    """A bearer token for the API and the CLI, bound to one user in one organisation,
    with its scopes and, optionally, an expiry.

    Only the SHA-256 of the secret is stored: the secret is shown once, at creation. The
    secret has 256 bits of entropy, so a plain (unsalted) hash is enough and lets a request
    find its token by an indexed lookup.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The secret's first characters.")
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.CharField(
        max_length=32,
        default=scopes_text(DEFAULT_SCOPES),
        help_text="Space-separated: read, jobs, admin (see Scope).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Refused from then on; never when empty."
    )
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The tokens page lists one user's tokens in one organisation.
            models.Index(fields=["organization", "user"], name="apitoken_org_user"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(token_hash__regex=r"^[0-9a-f]{64}$"), name="apitoken_hash_is_sha256"
            ),
            models.CheckConstraint(
                condition=Q(scopes__regex=rf"^{_ONE_SCOPE}( {_ONE_SCOPE}){{0,2}}$"),
                name="apitoken_scopes_known",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def scope_set(self) -> frozenset[str]:
        return frozenset(self.scopes.split())

    def has_scope(self, scope: str) -> bool:
        return scope in self.scope_set

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class Invitation(models.Model):
    """A link that lets one person sign up and join an organisation (SIGNUP_MODE=invite
    allows sign-up only through one). Like a token, only the SHA-256 of its secret is
    stored; the link is shown once, to the owner or admin who made it."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="invitations"
    )
    email = models.EmailField(help_text="Whom it was made for (the sign-up form's address).")
    role = models.CharField(
        max_length=16,
        choices=[
            (Membership.Role.ADMIN, "Admin"),
            (Membership.Role.MEMBER, "Member"),
            (Membership.Role.BILLING, "Billing"),
        ],
        default=Membership.Role.MEMBER,
    )
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The invitations page lists one organisation's, newest first.
            models.Index(fields=["organization", "-created_at"], name="invitation_org_recent"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(token_hash__regex=r"^[0-9a-f]{64}$"), name="invitation_hash_is_sha256"
            ),
            models.CheckConstraint(
                condition=Q(role__in=["admin", "member", "billing"]), name="invitation_role_valid"
            ),
            # Accepted by someone means accepted at some time (the person may be deleted
            # later, which keeps the time).
            models.CheckConstraint(
                condition=Q(accepted_by__isnull=True) | Q(accepted_at__isnull=False),
                name="invitation_accepted_when",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.email} to {self.organization_id} ({self.role})"

    def is_open(self, now: datetime) -> bool:
        return self.accepted_at is None and now < self.expires_at


class AuditEvent(models.Model):
    """Who did what in an organisation. Append-only: written by the services, never edited."""

    class Action(models.TextChoices):
        ORGANIZATION_CREATED = "organization.created", "Organisation created"
        MEMBER_ADDED = "member.added", "Member added"
        MEMBER_INVITED = "member.invited", "Member invited"
        MEMBER_REMOVED = "member.removed", "Member removed (or left)"
        MEMBER_ROLE_CHANGED = "member.role_changed", "Member's role changed"
        TOKEN_CREATED = "token.created", "API token created"
        TOKEN_REVOKED = "token.revoked", "API token revoked"
        JOB_SUBMITTED = "job.submitted", "Job submitted"
        JOB_CANCELLED = "job.cancelled", "Job cancelled"
        JOB_CONTROLLED = "job.controlled", "Job held, released or requeued"

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="audit_events"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    action = models.CharField(max_length=32, choices=Action.choices)
    target = models.CharField(max_length=100, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["organization", "-created_at"], name="audit_org_recent")]

    def __str__(self) -> str:
        return f"{self.action} {self.target}"


# Keys a person may hold: enough for every machine they use, bounded so that the list
# an agent would read stays small.
MAX_SSH_KEYS_PER_USER = 20


class SshKey(models.Model):
    """A person's SSH public key (the account page), for the agents that offer SSH into a
    session. Stored as authorized_keys holds it (`<type> <base64>`, checked by
    `tenants.sshkeys.parse_public_key`), with its fingerprint; a key once per person."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys"
    )
    name = models.CharField(max_length=100)
    key_type = models.CharField(max_length=32)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=60, help_text="SHA256, as ssh-keygen -l prints it.")
    bits = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "fingerprint"], name="sshkey_once_per_user"),
            models.CheckConstraint(
                condition=Q(fingerprint__regex=r"^SHA256:[A-Za-z0-9+/]{43}$"),
                name="sshkey_fingerprint_is_sha256",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"
