"""API tokens' scopes (read, jobs, admin) and expiry: chosen at creation, enforced on
every operation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from spurcloud.api.urls import urlpatterns
from spurcloud.api.views import TenantApi
from spurcloud.tenants.models import ApiToken
from spurcloud.tenants.services import create_api_token
from spurcloud.tenants.token_cache import forget_api_tokens
from tests.spurcloud.conftest import Tenant, make_user

READS = [
    "/api/v1/jobs",
    "/api/v1/jobs/1",
    "/api/v1/jobs/1/output",
    "/api/v1/queue",
    "/api/v1/nodes",
    "/api/v1/partitions",
]
WRITES = [("/api/v1/jobs", {"script": "#!/bin/sh\n"}), ("/api/v1/jobs/1/cancel", {})]


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _token(tenant: Tenant, who: str, **kwargs: Any) -> tuple[ApiToken, APIClient]:
    token, secret = create_api_token(
        user=getattr(tenant, who), organization=tenant.organization, name="t", **kwargs
    )
    return token, _client(secret)


@pytest.fixture(params=["acme-owner", "acme-member", "globex-owner"])
def tenant_and_who(request: pytest.FixtureRequest, acme: Tenant, globex: Tenant) -> Any:
    """Owner and member of the organisation, and an outsider (in theirs): the rules are
    the same for all."""
    name, who = request.param.split("-")
    return {"acme": acme, "globex": globex}[name], who


def test_every_api_view_names_the_scope_of_each_of_its_methods() -> None:
    views = {p.callback.view_class for p in urlpatterns if hasattr(p.callback, "view_class")}
    tenant_views = [v for v in views if issubclass(v, TenantApi)]
    assert len(tenant_views) >= 7
    for view in tenant_views:
        methods = {m.upper() for m in view.http_method_names if hasattr(view, m)} - {"OPTIONS"}
        assert methods <= set(view.required_scopes), view


def test_a_read_only_token_reads_but_cannot_submit_or_act(tenant_and_who: Any) -> None:
    tenant, who = tenant_and_who
    _, client = _token(tenant, who, scopes={"read"})
    assert client.get("/api/v1/jobs").status_code == 200
    for path, body in WRITES:
        response = client.post(path, body, format="json")
        assert response.status_code == 403, path
        assert "lacks the 'jobs' scope" in response.json()["detail"]


def test_a_jobs_only_token_cannot_read(tenant_and_who: Any) -> None:
    tenant, who = tenant_and_who
    _, client = _token(tenant, who, scopes={"jobs"})
    for path in READS:
        response = client.get(path)
        assert response.status_code == 403, path
        assert "lacks the 'read' scope" in response.json()["detail"]


def test_a_token_without_a_scope_or_with_an_unknown_one_is_not_made(acme: Tenant) -> None:
    for scopes in (set(), {"read", "write"}):
        with pytest.raises(ValueError):
            create_api_token(
                user=acme.member, organization=acme.organization, name="x", scopes=scopes
            )


@pytest.mark.parametrize("who", ["owner", "member"])
def test_only_staff_may_hold_an_admin_scoped_token(who: str, acme: Tenant) -> None:
    with pytest.raises(PermissionDenied, match="admin scope"):
        _token(acme, who, scopes={"read", "admin"})
    staff = make_user("operator", staff=True)
    from spurcloud.tenants.services import add_member

    add_member(organization=acme.organization, user=staff)
    token, _ = create_api_token(
        user=staff, organization=acme.organization, name="ops", scopes={"admin", "read"}
    )
    assert token.scopes == "read admin"


def test_new_tokens_read_and_submit_unless_told_otherwise(acme: Tenant) -> None:
    token, _ = _token(acme, "member")
    assert (token.scopes, token.expires_at) == ("read jobs", None)


@pytest.mark.parametrize("who", ["owner", "member"])
def test_an_expired_token_is_refused_and_says_when_it_expired(who: str, acme: Tenant) -> None:
    token, client = _token(acme, who, expires_at=timezone.now() + timedelta(days=1))
    assert client.get("/api/v1/jobs").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=datetime(2024, 5, 1, 12, 30, tzinfo=UTC))
    forget_api_tokens()  # as a row changed elsewhere is read API_TOKEN_CACHE_S later
    response = client.get("/api/v1/jobs")
    assert response.status_code == 401
    assert response.json()["detail"] == (
        "This API token expired at 2024-05-01 12:30 UTC; create a new one in the portal."
    )


def test_a_token_cannot_be_made_already_expired(acme: Tenant) -> None:
    with pytest.raises(ValueError, match="future"):
        _token(acme, "member", expires_at=timezone.now() - timedelta(seconds=1))


@pytest.mark.parametrize("who", ["owner", "member"])
def test_the_portal_makes_a_token_with_the_scopes_and_lifetime_chosen(
    who: str, acme: Tenant
) -> None:
    browser = Client()
    browser.force_login(getattr(acme, who))
    page = browser.get("/tokens/").content.decode()
    assert 'value="read"' in page and 'value="jobs"' in page
    assert 'value="admin"' not in page  # offered to staff only
    response = browser.post("/tokens/", {"name": "ci", "scopes": ["read"], "expires_in_days": "30"})
    assert response.status_code == 200
    token = ApiToken.objects.get(name="ci")
    assert token.scopes == "read"
    assert token.expires_at is not None
    assert abs(token.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    listed = browser.get("/tokens/").content.decode()
    assert "<td>read</td>" in listed


def test_the_portal_offers_no_admin_scope_to_a_member_who_asks_anyway(acme: Tenant) -> None:
    browser = Client()
    browser.force_login(acme.member)
    response = browser.post("/tokens/", {"name": "x", "scopes": ["admin"], "expires_in_days": ""})
    assert b"Select a valid choice" in response.content
    assert not ApiToken.objects.filter(name="x").exists()


def test_the_portal_offers_the_admin_scope_to_staff(acme: Tenant) -> None:
    staff = make_user("operator", staff=True)
    from spurcloud.tenants.services import add_member

    add_member(organization=acme.organization, user=staff)
    browser = Client()
    browser.force_login(staff)
    assert b'value="admin"' in browser.get("/tokens/").content
    browser.post("/tokens/", {"name": "ops", "scopes": ["read", "admin"], "expires_in_days": ""})
    token = ApiToken.objects.get(name="ops")
    assert (token.scopes, token.expires_at) == ("read admin", None)


@pytest.mark.django_db(transaction=True)
def test_tokens_made_before_scopes_existed_read_and_submit() -> None:
    executor = MigrationExecutor(connection)
    # Back to before scopes, then forward to every app's latest: going back unapplies
    # the other apps' migrations that depend on later tenants ones (billing's), which
    # the tests after this one need.
    before, after = (("tenants", "0002_audit_job_controlled"), executor.loader.graph.leaf_nodes())
    executor.migrate([before])
    old = MigrationExecutor(connection).loader.project_state([before]).apps
    user = old.get_model("auth", "User").objects.create(username="old")
    organization = old.get_model("tenants", "Organization").objects.create(name="O", slug="o")
    old.get_model("tenants", "ApiToken").objects.create(
        user=user, organization=organization, name="old", prefix="spur_x", token_hash="a" * 64
    )
    MigrationExecutor(connection).migrate(after)
    token = ApiToken.objects.get(name="old")
    assert (token.scopes, token.expires_at) == ("read jobs", None)
