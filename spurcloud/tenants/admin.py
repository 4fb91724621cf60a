from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest

from spurcloud.tenants.models import ApiToken, AuditEvent, Invitation, Membership, Organization

# Django's admin classes are generic only in their stubs: subscripting them at run time
# fails, so the model-typed bases exist for the type checker alone.
if TYPE_CHECKING:
    _MembershipInline = admin.TabularInline[Membership, Organization]
    _OrganizationAdmin = admin.ModelAdmin[Organization]
    _MembershipAdmin = admin.ModelAdmin[Membership]
    _ApiTokenAdmin = admin.ModelAdmin[ApiToken]
    _AuditEventAdmin = admin.ModelAdmin[AuditEvent]
    _InvitationAdmin = admin.ModelAdmin[Invitation]
else:
    _MembershipInline = admin.TabularInline
    _OrganizationAdmin = _MembershipAdmin = _ApiTokenAdmin = _AuditEventAdmin = admin.ModelAdmin
    _InvitationAdmin = admin.ModelAdmin


class MembershipInline(_MembershipInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(_OrganizationAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(_MembershipAdmin):
    list_display = ["user", "organization", "role", "created_at"]
    list_filter = ["role"]
    list_select_related = ["user", "organization"]
    search_fields = ["user__email", "user__username", "organization__slug"]
    raw_id_fields = ["user", "organization"]


@admin.register(ApiToken)
class ApiTokenAdmin(_ApiTokenAdmin):
    list_display = [
        "name",
        "prefix",
        "user",
        "organization",
        "scopes",
        "created_at",
        "expires_at",
        "last_used_at",
    ]
    list_filter = ["revoked_at", "scopes"]
    list_select_related = ["user", "organization"]
    search_fields = ["name", "prefix", "user__email", "organization__slug"]
    # The hash is useless to a person and the secret is never stored: tokens are created
    # through the portal or seed_demo, which show the secret once.
    readonly_fields = ["prefix", "token_hash", "scopes", "created_at", "last_used_at"]
    raw_id_fields = ["user", "organization"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(_AuditEventAdmin):
    list_display = ["created_at", "organization", "actor", "action", "target"]
    list_filter = ["action"]
    list_select_related = ["organization", "actor"]
    search_fields = ["target", "organization__slug"]
    # The trail is append-only (the services write it): an operator reads it here, and
    # can neither add an event by hand, edit one, nor delete one or many. Without the
    # change permission the admin shows each event read-only.
    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False


@admin.register(Invitation)
class InvitationAdmin(_InvitationAdmin):
    list_display = ["email", "organization", "role", "created_by", "created_at", "expires_at",
                    "accepted_at"]  # fmt: skip
    list_filter = ["role"]
    list_select_related = ["organization", "created_by"]
    search_fields = ["email", "organization__slug"]
    # Made in the portal (by an owner or admin, who is shown the link once); here an
    # operator can see them and shorten one's life (expires_at).
    readonly_fields = ["token_hash", "created_by", "created_at", "accepted_at", "accepted_by"]
    raw_id_fields = ["organization"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
