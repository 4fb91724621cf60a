"""Reads across the tenant boundary. "Missing" and "not yours" raise the same 404."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from django.db.models import Exists, OuterRef, QuerySet
from django.http import Http404

from spurcloud.tenants import tokens
from spurcloud.tenants.models import ApiToken, Membership, Organization

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django_stubs_ext import WithAnnotations

    class _TokenAnnotations(TypedDict):
        is_member: bool

    # An ApiToken as `api_token_for_secret` reads it, with its `is_member` annotation.
    AnnotatedApiToken = WithAnnotations[ApiToken, _TokenAnnotations]


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
    """The token whose hash matches, revoked or not, with `user` and `organization` loaded
    and `is_member` annotated (a token outlives neither the user's membership nor the
    user's active flag). One query."""
    if not tokens.looks_like_secret(secret):
        return None
    return (
        ApiToken.objects.filter(token_hash=tokens.hash_secret(secret))
        .select_related("user", "organization")
        .annotate(
            is_member=Exists(
                Membership.objects.filter(
                    user=OuterRef("user"), organization=OuterRef("organization")
                )
            )
        )
        .first()
    )
