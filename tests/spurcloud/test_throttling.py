"""Rate limits: the API's per address, per token and per organisation's submissions (429
with Retry-After, on the shared cache), and the sign-in forms' (the portal's, allauth's,
and the admin's, which counts against the same limits)."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from spurcloud.tenants.services import create_api_token
from tests.spurcloud.conftest import Tenant, api_client, make_user


def _assert_throttled(response: Any, says: str) -> None:
    assert response.status_code == 429
    assert response.json()["code"] == "throttled"
    assert says in response.json()["detail"]
    assert 1 <= int(response["Retry-After"]) <= 60


@pytest.mark.parametrize("who", ["as_owner", "as_member", "as_outsider"])
def test_a_token_over_its_rate_is_429_with_retry_after(
    who: str, settings: Any, request: pytest.FixtureRequest
) -> None:
    settings.API_REQUESTS_PER_MINUTE_PER_TOKEN = 3
    client: APIClient = request.getfixturevalue(who)
    for _ in range(3):
        assert client.get("/api/v1/jobs").status_code == 200
    _assert_throttled(client.get("/api/v1/jobs"), "this API token (at most 3 a minute)")


def test_each_token_has_its_own_count(acme: Tenant, settings: Any) -> None:
    settings.API_REQUESTS_PER_MINUTE_PER_TOKEN = 1
    first, second = (
        api_client(acme.member, acme.organization),
        api_client(acme.member, acme.organization),
    )
    assert first.get("/api/v1/jobs").status_code == 200
    assert first.get("/api/v1/jobs").status_code == 429
    assert second.get("/api/v1/jobs").status_code == 200


def test_an_address_over_its_rate_is_refused_before_any_token_is_looked_up(
    db: None, settings: Any, django_assert_num_queries: Any
) -> None:
    settings.API_REQUESTS_PER_MINUTE_PER_IP = 2
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer spur_" + "x" * 43)
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/api/v1/jobs").status_code == 401
    with django_assert_num_queries(0):
        _assert_throttled(client.get("/api/v1/jobs"), "your address (at most 2 a minute)")
    assert APIClient(REMOTE_ADDR="10.0.0.2").get("/api/v1/jobs").status_code == 401


def test_a_forwarded_for_header_does_not_escape_the_address_limit(db: None, settings: Any) -> None:
    settings.API_REQUESTS_PER_MINUTE_PER_IP = 1
    client = APIClient()
    assert client.get("/api/v1/jobs", HTTP_X_FORWARDED_FOR="10.9.9.1").status_code == 401
    assert client.get("/api/v1/jobs", HTTP_X_FORWARDED_FOR="10.9.9.2").status_code == 429


def test_behind_a_trusted_proxy_the_address_it_saw_is_counted(db: None, settings: Any) -> None:
    settings.API_REQUESTS_PER_MINUTE_PER_IP = 1
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    client = APIClient()
    assert client.get("/api/v1/jobs", HTTP_X_FORWARDED_FOR="10.9.9.1").status_code == 401
    assert client.get("/api/v1/jobs", HTTP_X_FORWARDED_FOR="10.9.9.2").status_code == 401
    assert client.get("/api/v1/jobs", HTTP_X_FORWARDED_FOR="10.9.9.2").status_code == 429


def test_an_organisations_submissions_are_capped_per_minute_for_all_its_members(
    acme: Tenant, as_owner: APIClient, as_member: APIClient, as_outsider: APIClient, settings: Any
) -> None:
    settings.API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION = 2
    # Refused bodies (no script) are submissions too: the cap is on attempts.
    assert as_owner.post("/api/v1/jobs", {}, format="json").status_code == 400
    assert as_member.post("/api/v1/jobs", {}, format="json").status_code == 400
    response = as_member.post("/api/v1/jobs", {"script": "#!/bin/sh\n"}, format="json")
    _assert_throttled(response, "Your organisation has sent 2 job submissions in the last minute")
    assert as_member.get("/api/v1/jobs").status_code == 200  # reading is not submitting
    assert as_outsider.post("/api/v1/jobs", {}, format="json").status_code == 400  # theirs


def test_the_schema_says_every_operation_may_answer_429_with_retry_after(db: None) -> None:
    schema = Client().get("/api/schema/?format=json").json()
    operations = [op for path in schema["paths"].values() for op in path.values()]
    assert len(operations) >= 7
    for operation in operations:
        throttled = operation["responses"]["429"]
        assert throttled["headers"]["Retry-After"]["schema"]["type"] == "integer"
        assert "403" in operation["responses"]  # a token without the scope


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (REDIS_URL)")
def test_the_counts_live_in_the_shared_redis_cache(acme: Tenant, settings: Any) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": os.environ["REDIS_URL"],
            "KEY_PREFIX": f"test-{uuid.uuid4().hex}",  # nothing of another run or test
        }
    }
    settings.API_REQUESTS_PER_MINUTE_PER_TOKEN = 2
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="r")
    # Two clients, as two web processes would be: one count between them.
    one, two = APIClient(), APIClient()
    for client in (one, two):
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert one.get("/api/v1/jobs").status_code == 200
    assert two.get("/api/v1/jobs").status_code == 200
    assert one.get("/api/v1/jobs").status_code == 429
    cache.clear()  # this test's prefix only


# -- sign-in forms ------------------------------------------------------------------------


def _portal_sign_in(browser: Client, password: str) -> Any:
    return browser.post("/accounts/login/", {"login": "max@example.com", "password": password})


def test_the_portals_sign_in_is_rate_limited(acme: Tenant, settings: Any) -> None:
    settings.ACCOUNT_RATE_LIMITS = {"login_failed": "10/m/ip,3/300s/key"}
    browser = Client()
    for _ in range(3):
        assert b"not correct" in _portal_sign_in(browser, "wrong").content
    refused = _portal_sign_in(browser, "correct horse battery")
    assert b"Too many failed login attempts" in refused.content
    assert "_auth_user_id" not in browser.session


def _admin_sign_in(browser: Client, password: str, username: str = "root") -> Any:
    return browser.post(
        "/admin/login/", {"username": username, "password": password, "next": "/admin/"}
    )


@pytest.fixture
def operator(db: None) -> Any:
    return make_user("root", staff=True)


def test_the_admins_sign_in_is_rate_limited_like_the_portals(operator: Any, settings: Any) -> None:
    settings.ACCOUNT_RATE_LIMITS = {"login_failed": "10/m/ip,3/300s/key"}
    browser = Client()
    for _ in range(3):
        assert _admin_sign_in(browser, "wrong").status_code == 200  # the form, with its error
    refused = _admin_sign_in(browser, "correct horse battery")
    assert refused.status_code == 429
    assert "_auth_user_id" not in browser.session
    assert _admin_sign_in(Client(), "wrong", username="someone").status_code == 200  # per account


def test_the_admin_and_the_portal_share_the_per_address_count(
    acme: Tenant, operator: Any, settings: Any
) -> None:
    settings.ACCOUNT_RATE_LIMITS = {"login_failed": "4/m/ip,100/300s/key"}
    browser = Client()
    for _ in range(2):
        _admin_sign_in(browser, "wrong")
        _portal_sign_in(browser, "wrong")
    assert _admin_sign_in(browser, "correct horse battery").status_code == 429


def test_an_operator_who_signs_in_is_not_counted(operator: Any, settings: Any) -> None:
    settings.ACCOUNT_RATE_LIMITS = {"login_failed": "10/m/ip,2/300s/key"}
    for _ in range(4):
        response = _admin_sign_in(Client(), "correct horse battery")
        assert response.status_code == 302 and response["Location"] == "/admin/"


@pytest.fixture
def redis_counts(settings: Any) -> Any:
    """The limits counted on Redis (REDIS_URL, as production), under a prefix of this test's
    own; the round trips to it counted."""
    import redis

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = f"test-{uuid.uuid4().hex}"
    redis_cache = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": url,
        "KEY_PREFIX": prefix,
    }
    settings.CACHES = {**settings.CACHES, "default": redis_cache}
    trips: list[str] = []
    plain, piped = redis.Redis.execute_command, redis.client.Pipeline.execute

    def command(self: Any, *args: Any, **kw: Any) -> Any:
        trips.append(str(args[0]))
        return plain(self, *args, **kw)

    def pipeline(self: Any, *args: Any, **kw: Any) -> Any:
        trips.append("pipeline")
        return piped(self, *args, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.Redis, "execute_command", command)
        patch.setattr(redis.client.Pipeline, "execute", pipeline)
        yield trips
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def test_on_redis_a_request_counts_each_check_in_one_round_trip(
    acme: Tenant, settings: Any, redis_counts: list[str]
) -> None:
    settings.API_REQUESTS_PER_MINUTE_PER_TOKEN = 2
    client = api_client(acme.member, acme.organization)
    assert client.get("/api/v1/jobs").status_code == 200
    # Before the token (per address), after it (per token): a pipeline each, nothing else.
    assert redis_counts == ["pipeline", "pipeline"]
    assert client.get("/api/v1/jobs").status_code == 200
    _assert_throttled(client.get("/api/v1/jobs"), "this API token (at most 2 a minute)")
