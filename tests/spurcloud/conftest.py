"""Fixtures for the web app's tests: organisations seen from three sides (owner, member,
outsider in another organisation), API clients with real tokens, job events."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core.cache import cache
from rest_framework.test import APIClient, ForceAuthClientHandler, force_authenticate

from scheduler.core.contract import JobSpec
from scheduler.core.jobs import Job
from spurcloud.asgi_http import TokenApiHandler, token_api_request
from spurcloud.portal.catalog import forget_catalog
from spurcloud.tenants.models import Membership, Organization
from spurcloud.tenants.services import add_member, create_api_token, create_organization

User = get_user_model()


@dataclass
class Tenant:
    organization: Organization
    owner: Any
    member: Any


def make_user(username: str, *, confirmed: bool = True, staff: bool = False) -> Any:
    """A user who signed up as `<username>@example.com` and, unless told otherwise,
    confirmed that address (SIGNUP_MODE verified, the default, requires it)."""
    user = User.objects.create_user(
        username=username,
        email=f"{username}@example.com",
        password="correct horse battery",
        is_staff=staff,
    )
    EmailAddress.objects.create(user=user, email=user.email, primary=True, verified=confirmed)
    return user


@pytest.fixture(autouse=True)
def quick_controller_retries(settings: Any) -> None:
    """An unreachable controller answers 503 after a short retry (production: seconds)."""
    settings.SPUR_CONTROLLER_RETRY_S = 0.2


@pytest.fixture(autouse=True)
def fresh_dashboard_catalog() -> None:
    """Every test reads the controller afresh: the dashboard's catalog, kept a second in
    the process (portal/catalog.py), would otherwise carry the last test's cluster."""
    forget_catalog()


@pytest.fixture(autouse=True)
def fresh_rate_limits(settings: Any) -> None:
    """Every test counts its requests from zero, in this process's memory (counters in
    the shared Redis would outlive the test, and reach the next run), under limits that
    no test reaches by accident. Tests of the limits set their own."""
    in_memory = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    settings.CACHES = {"default": in_memory, "shared": in_memory}
    settings.API_REQUESTS_PER_MINUTE_PER_TOKEN = 1_000_000
    settings.API_REQUESTS_PER_MINUTE_PER_IP = 1_000_000
    settings.API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION = 1_000_000
    cache.clear()


@pytest.fixture
def acme(db: None) -> Tenant:
    owner = make_user("olivia")
    organization = create_organization(name="Acme", owner=owner, slug="acme")
    member = make_user("max")
    add_member(organization=organization, user=member, role=Membership.Role.MEMBER, by=owner)
    return Tenant(organization, owner, member)


@pytest.fixture
def globex(db: None) -> Tenant:
    """Another organisation: its people are the outsiders of `acme`."""
    owner = make_user("oscar")
    organization = create_organization(name="Globex", owner=owner, slug="globex")
    member = make_user("gina")
    add_member(organization=organization, user=member, by=owner)
    return Tenant(organization, owner, member)


class TokenApiClientHandler(ForceAuthClientHandler):
    """The test client's handler, with the server's choice of chain: an API operation's
    request with a bearer token takes the short one (spurcloud/asgi_http.py), every
    other request Django's whole MIDDLEWARE."""

    token_api: TokenApiHandler | None = None

    def get_response(self, request: Any) -> Any:
        if not token_api_request(request):
            return super().get_response(request)
        if self.token_api is None:  # built on first use, as the client's own chain
            self.token_api = TokenApiHandler()
        force_authenticate(request, self._force_user, self._force_token)
        return self.token_api.get_response(request)


class TokenApiClient(APIClient):
    """An API client whose token requests go through the middleware the server's go
    through (`TokenApiClientHandler`)."""

    def __init__(self, enforce_csrf_checks: bool = False, **defaults: Any) -> None:
        super().__init__(enforce_csrf_checks, **defaults)
        self.handler = TokenApiClientHandler(enforce_csrf_checks)


def api_client(user: Any, organization: Organization) -> APIClient:
    _, secret = create_api_token(user=user, organization=organization, name="test")
    client = TokenApiClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def as_owner(acme: Tenant) -> APIClient:
    return api_client(acme.owner, acme.organization)


@pytest.fixture
def as_member(acme: Tenant) -> APIClient:
    return api_client(acme.member, acme.organization)


@pytest.fixture
def as_outsider(globex: Tenant) -> APIClient:
    return api_client(globex.owner, globex.organization)


_seq = itertools.count(1000)


def job_dict(job_id: int, *, tenant: str, user: str, **changes: Any) -> dict[str, Any]:
    """A job dict as the controller emits it: the core's own `Job.to_dict()` of a pending
    two-GPU job (so the web's tests read the contract's keys, never a copy of them)."""
    spec = JobSpec(
        script="#!/bin/sh\ntrue\n",
        name=f"train-{job_id}",
        tenant=tenant,
        user=user,
        workdir="/home/max",
        cpus_per_task=4,
        gpus_per_node=2,
        time_limit_min=60,
    )
    job = Job(
        job_id=job_id,
        spec=spec,
        partition="gpu",
        account=tenant,
        time_limit_min=60,
        submit_time=time.time(),
        eligible_time=time.time(),
        reason="Priority",
    )
    out = job.to_dict(dependency="(null)")
    out.update(changes)
    return out


def event(job: dict[str, Any], *, seq: int | None = None, kind: str = "changed") -> dict[str, Any]:
    seq = next(_seq) if seq is None else seq
    return {
        "seq": seq,
        "cluster": "spur",
        "kind": kind,
        "at": time.time(),
        "job": {**job, "seq": seq},
    }


@pytest.fixture
def make_event() -> Callable[..., dict[str, Any]]:
    return event


@pytest.fixture
def live_controller(controller: Any, settings: Any) -> Any:
    """The lead's real `spurctld` (tests/fixtures/controller.py), with this site pointed at it
    and one registered node (one GPU) so submissions can be placed."""
    settings.SPUR_CONTROLLER_URLS = [controller.url]
    settings.SPUR_CLUSTER_TOKEN = controller.token
    client = controller.client()
    try:
        client.register_node(
            {
                "name": "node01",
                "cpus": 16,
                "memory_mb": 64000,
                "agent_url": "http://127.0.0.1:9",
                "gpus": [{"index": 0, "vendor": "nvidia", "model": "h100", "memory_mb": 81920}],
            }
        )
    finally:
        client.close()
    return controller
