"""What the slurmrestd routes answer to bad credentials and bad input: an error body in
slurmrestd's shape (`errors: [{error, error_number, description, source}]`), valid
against Slurm's schema for the route, with a 4xx status, never a 500; nothing is
submitted. Nothing here reaches the controller (no `live_controller`): every request is
refused before it would."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import Scope
from spurcloud.tenants.services import create_api_token
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.test_slurmrestd_schema import needs_reference, validate

pytestmark = needs_reference

SUBMIT = "/slurm/v0.0.41/job/submit"
JOB = {"job": {"script": "#!/bin/sh\ntrue\n", "current_working_directory": "/"}}


def _secret(tenant: Tenant, *, scopes: Any = None) -> str:
    kwargs = {"scopes": scopes} if scopes is not None else {}
    _, secret = create_api_token(
        user=tenant.member, organization=tenant.organization, name="t", **kwargs
    )
    return secret


def _refused(response: Any, status: int, schema: str = "openapi_job_submit_response") -> Any:
    assert response.status_code == status, response.content
    body = response.json()
    validate("v0.0.41", schema, body)
    (error,) = body["errors"]
    assert set(error) == {"error", "error_number", "description", "source"}
    return error


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no token at all
        {"HTTP_X_SLURM_USER_TOKEN": "spur_not_a_real_token"},
        {"HTTP_AUTHORIZATION": "Bearer spur_not_a_real_token"},
    ],
)
def test_a_missing_or_unknown_token_is_401(acme: Tenant, headers: dict[str, str]) -> None:
    response = APIClient().get("/slurm/v0.0.41/jobs", **headers)
    error = _refused(response, 401, "openapi_job_info_resp")
    assert error["error_number"] == 1007
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_the_token_in_the_wrong_header_is_401_and_says_where_it_goes(acme: Tenant) -> None:
    secret = _secret(acme)
    cases = [
        {"HTTP_X_SLURM_USER_NAME": secret},  # the token where the user name goes
        {"HTTP_AUTHORIZATION": secret},  # no "Bearer"
        {"HTTP_X_SLURM_USER_TOKEN": f"Bearer {secret}"},
        {"HTTP_X_SLURM_USER_TOKEN": secret, "HTTP_AUTHORIZATION": f"Bearer {secret}"},
    ]
    for headers in cases:
        error = _refused(APIClient().post(SUBMIT, JOB, format="json", **headers), 401)
        assert "token" in error["description"].lower(), error
    assert not JobRecord.objects.exists()


def test_a_user_name_that_does_not_match_the_token_is_401(acme: Tenant) -> None:
    secret = _secret(acme)  # max's
    for path in ("/slurm/v0.0.42/jobs", "/slurm/v0.0.42/diag/"):
        response = APIClient().get(
            path, HTTP_X_SLURM_USER_TOKEN=secret, HTTP_X_SLURM_USER_NAME="olivia"
        )
        error = _refused(response, 401, "openapi_resp")
        assert "does not name the user" in error["description"]
    bearer = APIClient().get(
        "/slurm/v0.0.42/jobs", HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_X_SLURM_USER_NAME="oscar"
    )
    assert "does not name the user" in _refused(bearer, 401, "openapi_resp")["description"]
    response = APIClient().get(
        "/slurm/v0.0.42/diag/", HTTP_X_SLURM_USER_TOKEN=secret, HTTP_X_SLURM_USER_NAME="max"
    )
    assert response.status_code == 503  # past authentication: no controller in this test
    _refused(response, 503, "openapi_diag_resp")


def test_a_read_only_token_reads_but_does_not_submit_or_cancel(acme: Tenant) -> None:
    client = APIClient()
    client.credentials(HTTP_X_SLURM_USER_TOKEN=_secret(acme, scopes={Scope.READ}))
    error = _refused(client.post(SUBMIT, JOB, format="json"), 403)
    assert "'jobs' scope" in error["description"]
    _refused(client.delete("/slurm/v0.0.41/job/1"), 403, "openapi_resp")
    assert not JobRecord.objects.exists()


@pytest.fixture
def member(acme: Tenant) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_SLURM_USER_TOKEN=_secret(acme))
    return client


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ("{not json", "application/json", 400),
        ("[" * 100_000 + "]" * 100_000, "application/json", 400),  # nested too deeply
        ('{"job": {"script": "#!/bin/sh\\n", "scrpit": 1}}', "application/json", 400),
        ('{"job": {"script": "#!/bin/sh\\n"}, "extra": 1}', "application/json", 400),
        ('{"job": {"script": "#!/bin/sh\\n", "tasks": 1e400}}', "application/json", 400),
        (
            '{"job": {"script": "#!/bin/sh\\n", "tasks": 99999999999999999999999}}',
            "application/json",
            400,
        ),
        (
            '{"job": {"script": "#!/bin/sh\\n", "time_limit": {"number": -1}}}',
            "application/json",
            400,
        ),
        (
            '{"job": {"script": "#!/bin/sh\\n", "environment": ["A\\u0000=b"]}}',
            "application/json",
            400,
        ),
        ("job=1", "application/x-www-form-urlencoded", 415),
        ("", "application/json", 400),
    ],
)
def test_bad_input_is_an_error_body_and_submits_nothing(
    member: APIClient, body: str, content_type: str, status: int
) -> None:
    error = _refused(member.post(SUBMIT, body, content_type=content_type), status)
    assert error["description"]
    assert not JobRecord.objects.exists()


def test_a_body_past_the_limit_is_413_unread(member: APIClient, monkeypatch: Any) -> None:
    from spurcloud.slurmrestd import views

    monkeypatch.setattr(views, "MAX_BODY", 1000)
    response = member.post(SUBMIT, {"job": {"script": "#!/bin/sh\n" + "x" * 2000}}, format="json")
    _refused(response, 413)


@pytest.mark.parametrize(
    ("path", "status", "schema"),
    [
        ("/slurm/v0.0.41/jobs?bogus=1", 400, "openapi_job_info_resp"),
        ("/slurm/v0.0.41/jobs?flags=NOPE", 400, "openapi_job_info_resp"),
        ("/slurm/v0.0.41/job/abc", 404, "openapi_job_info_resp"),
        ("/slurm/v0.0.41/job/99999999999999999999999", 404, "openapi_job_info_resp"),
        ("/slurm/v0.0.41/job/123", 404, "openapi_job_info_resp"),
        ("/slurm/v0.0.41/reservations", 404, "openapi_resp"),
        ("/slurm/v0.0.38/ping", 404, "openapi_resp"),
        ("/slurm/nothing", 404, "openapi_resp"),
    ],
)
def test_bad_paths_and_queries_are_slurm_errors(
    member: APIClient, path: str, status: int, schema: str
) -> None:
    _refused(member.get(path), status, schema)


def test_a_method_the_route_does_not_take_is_405(member: APIClient) -> None:
    _refused(member.post("/slurm/v0.0.41/jobs", {}, format="json"), 405, "openapi_job_info_resp")
