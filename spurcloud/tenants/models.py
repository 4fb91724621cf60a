"""Organisations (the tenants), who belongs to them, their API tokens, and an audit trail."""

from __future__ import annotations

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
                condition=Q(role__in=["owner", "admin", "member"]), name="membership_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"

    @property
    def manages_organization(self) -> bool:
        """Owners and admins act on everyone's jobs; members on their own."""
        return self.role in (self.Role.OWNER, self.Role.ADMIN)


class ApiToken(models.Model):
    """A bearer token for the API and the CLI, bound to one user in one organisation.

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
    created_at = models.DateTimeField(auto_now_add=True)
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
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class AuditEvent(models.Model):
    """Who did what in an organisation. Append-only: written by the services, never edited."""

    class Action(models.TextChoices):
        ORGANIZATION_CREATED = "organization.created", "Organisation created"
        MEMBER_ADDED = "member.added", "Member added"
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
