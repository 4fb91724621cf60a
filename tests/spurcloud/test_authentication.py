"""The API's bearer tokens: 401 with a clear message for anything but a live token."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from spurcloud.tenants import token_cache
from spurcloud.tenants.models import ApiToken, Membership
from spurcloud.tenants.services import create_api_token, revoke_api_token
from tests.spurcloud.conftest import Tenant

URL = "/api/v1/jobs"


def _client(secret: str | None = None, header: str | None = None) -> APIClient:
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    elif secret is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_a_request_without_a_token_is_401(db: None) -> None:
    response = _client().get(URL)
    assert response.status_code == 401
    assert response.json()["detail"] == "Authentication credentials were not provided."
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_an_unknown_token_is_401(db: None) -> None:
    response = _client("spur_" + "x" * 43).get(URL)
    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid API token."


def test_a_malformed_header_is_401_and_says_what_is_expected(db: None) -> None:
    response = _client(header="Token abc").get(URL)
    assert response.status_code == 401
    assert "Bearer spur_" in response.json()["detail"]


def test_a_revoked_token_is_401(acme: Tenant) -> None:
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    revoke_api_token(token=token)
    response = _client(secret).get(URL)
    assert response.status_code == 401
    assert response.json()["detail"] == "This API token has been revoked."


def test_a_token_dies_with_its_users_membership(acme: Tenant) -> None:
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    Membership.objects.filter(user=acme.member).delete()
    response = _client(secret).get(URL)
    assert response.status_code == 401
    assert "no longer active" in response.json()["detail"]


def test_a_token_of_a_deactivated_user_is_401(acme: Tenant) -> None:
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    acme.member.is_active = False
    acme.member.save()
    assert _client(secret).get(URL).status_code == 401


def test_a_good_token_authenticates_and_notes_when_it_was_used(acme: Tenant) -> None:
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    assert token.last_used_at is None
    response = _client(secret).get(URL)
    assert response.status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_last_used_is_written_at_most_once_a_minute(
    acme: Tenant, django_assert_num_queries: object
) -> None:
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    client = _client(secret)
    # token lookup (with user, organisation and membership), the history's version and
    # the page of jobs; no UPDATE
    with django_assert_num_queries(3):  # type: ignore[operator]
        assert client.get(URL).status_code == 200


def test_a_token_read_moments_ago_costs_no_query(
    acme: Tenant, settings: Any, django_assert_num_queries: Any
) -> None:
    settings.API_TOKEN_CACHE_S = 5.0
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    client = _client(secret)
    assert client.get(URL).status_code == 200
    with django_assert_num_queries(1):  # the history's version only (its answer is kept)
        assert client.get(URL).status_code == 200


def test_a_token_revoked_elsewhere_is_refused_once_the_cache_time_has_passed(
    acme: Tenant, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.API_TOKEN_CACHE_S = 5.0
    now = [1000.0]
    monkeypatch.setattr(token_cache, "clock", lambda: now[0])
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    client = _client(secret)
    assert client.get(URL).status_code == 200
    # As another web process revokes it: a plain UPDATE, nothing this process hears of.
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    now[0] += 4.9
    assert client.get(URL).status_code == 200  # still within API_TOKEN_CACHE_S
    now[0] += 0.2
    response = client.get(URL)
    assert response.status_code == 401
    assert response.json()["detail"] == "This API token has been revoked."


def test_a_token_revoked_in_this_process_is_refused_at_once(
    acme: Tenant, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.API_TOKEN_CACHE_S = 60.0
    token, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    client = _client(secret)
    assert client.get(URL).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        revoke_api_token(token=token, by=acme.owner)
    assert client.get(URL).status_code == 401


def test_a_member_deactivated_in_this_process_is_refused_at_once(
    acme: Tenant, settings: Any
) -> None:
    settings.API_TOKEN_CACHE_S = 60.0
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="x")
    client = _client(secret)
    assert client.get(URL).status_code == 200
    acme.member.is_active = False
    acme.member.save()
    assert client.get(URL).status_code == 401
