"""Organisations, memberships and API tokens."""

from __future__ import annotations

import hashlib

import pytest
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError
from django.http import Http404

from spurcloud.tenants.models import ApiToken, AuditEvent, Membership
from spurcloud.tenants.selectors import access_api_token, access_membership, api_token_for_secret
from spurcloud.tenants.services import (
    add_member,
    create_api_token,
    create_organization,
    revoke_api_token,
)
from tests.spurcloud.conftest import Tenant, make_user


def test_creating_an_organisation_makes_its_creator_the_owner(db: None) -> None:
    user = make_user("ada")
    organization = create_organization(name="Analytical Engines", owner=user)
    assert organization.slug == "analytical-engines"
    membership = Membership.objects.get(user=user, organization=organization)
    assert membership.role == Membership.Role.OWNER
    assert AuditEvent.objects.filter(
        organization=organization, action=AuditEvent.Action.ORGANIZATION_CREATED
    ).exists()


def test_slugs_made_from_names_are_kept_unique(db: None) -> None:
    user = make_user("ada")
    first = create_organization(name="Lab", owner=user)
    second = create_organization(name="Lab", owner=user)
    assert (first.slug, second.slug) == ("lab", "lab-2")


def test_adding_a_member_twice_updates_the_role(acme: Tenant) -> None:
    add_member(organization=acme.organization, user=acme.member, role=Membership.Role.ADMIN)
    memberships = Membership.objects.filter(user=acme.member, organization=acme.organization)
    assert [m.role for m in memberships] == ["admin"]


def test_the_database_refuses_a_second_membership_of_the_same_pair(acme: Tenant) -> None:
    with pytest.raises(IntegrityError):
        Membership.objects.create(user=acme.member, organization=acme.organization)


def test_a_token_is_stored_as_the_sha256_of_its_secret(acme: Tenant) -> None:
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="cli")
    assert secret.startswith("spur_") and len(secret) > 40
    assert token.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert token.prefix == secret[:13]
    assert secret not in str(ApiToken.objects.filter(pk=token.pk).values().get())


def test_two_tokens_never_share_a_secret(acme: Tenant) -> None:
    secrets = {
        create_api_token(user=acme.member, organization=acme.organization, name=str(i))[1]
        for i in range(20)
    }
    assert len(secrets) == 20


def test_only_members_can_create_an_organisations_tokens(acme: Tenant, globex: Tenant) -> None:
    with pytest.raises(PermissionDenied):
        create_api_token(user=globex.owner, organization=acme.organization, name="sneaky")


def test_revoking_a_token_twice_is_harmless(acme: Tenant) -> None:
    token, _ = create_api_token(user=acme.member, organization=acme.organization, name="cli")
    assert revoke_api_token(token=token, by=acme.member) is True
    assert revoke_api_token(token=token, by=acme.member) is False
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(action=AuditEvent.Action.TOKEN_REVOKED).count() == 1


def test_a_token_is_found_by_its_secret_with_its_membership(acme: Tenant) -> None:
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    found = api_token_for_secret(secret)
    assert found is not None and found.pk == token.pk and found.member_role == "member"
    assert api_token_for_secret(secret + "x") is None
    assert api_token_for_secret("not-a-token") is None


def test_another_users_token_is_missing_not_forbidden(acme: Tenant) -> None:
    token, _ = create_api_token(user=acme.owner, organization=acme.organization, name="x")
    with pytest.raises(Http404):
        access_api_token(user=acme.member, organization=acme.organization, token_id=token.pk)
    with pytest.raises(Http404):
        access_api_token(user=acme.owner, organization=acme.organization, token_id=10**9)


def test_an_outsider_has_no_membership_of_the_organisation(acme: Tenant, globex: Tenant) -> None:
    assert access_membership(user=acme.member, organization_id=acme.organization.pk)
    with pytest.raises(Http404):
        access_membership(user=globex.owner, organization_id=acme.organization.pk)
