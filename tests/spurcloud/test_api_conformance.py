"""The API conforms to its OpenAPI schema, as schemathesis tests it: for generated requests
to every operation (valid ones, and invalid ones the schema rules out), no server error,
every status, header and body as the schema describes it. Bounded: a few dozen requests
per operation and mode, against a real controller, in this process (WSGI)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import ignored_auth, positive_data_acceptance

from spurcloud.tenants.services import create_api_token
from spurcloud.wsgi import application
from tests.spurcloud.conftest import Tenant

# Bounded for the suite; SCHEMATHESIS_EXAMPLES=500 for a deeper look by hand.
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "25"))


def _schema() -> Any:
    return schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


def _told(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", ())
    return "\n".join([str(exc), *(_told(e) for e in inner)])


def excluded(operation: Any) -> list[Any]:
    """A submission the schema allows may still be refused for what only the cluster
    knows (no such partition, QoS or GPU model, more than any node holds) or for a rule
    between fields (shards with whole GPUs): a 400 the schema describes, with the
    reason. A page cursor is the server's own token: one it did not make is refused
    (400). Every other request is accepted whenever its schema allows it.

    A job's output is read from its node's agent, and the test cluster's node has none
    (its agent URL answers nothing): a job that a generated submission started reads as
    503, which the schema documents. So `not_a_server_error` is left out there; any other
    server error (a 500) is still an undocumented status, which the status check refuses.
    tests/spurcloud/test_job_output.py reads output from a real (fake) agent.

    `ignored_auth` is left out everywhere: the token here is fixed (a member's), and that
    check takes it for a generated one; tests/spurcloud/test_authentication.py refuses
    missing, forged and revoked tokens."""
    where = (operation.method.upper(), operation.path)
    if where == ("POST", "/api/v1/jobs"):
        return [positive_data_acceptance]
    if where == ("PATCH", "/api/v1/queue/{job_id}"):
        # An update is checked as a submission is (no such partition, a limit over the
        # partition's, a negative nice from a tenant): the same 400s, for the same reasons.
        return [positive_data_acceptance]
    if where == ("POST", "/api/v1/jobs/{job_id}/steps"):
        # A step is checked against its job's allocation (more nodes, tasks or GPUs than
        # the job holds): a 400 the schema documents, for a body the schema allows.
        return [positive_data_acceptance]
    if where == ("GET", "/api/v1/jobs/{job_id}/output"):
        return [not_a_server_error]
    return []


def conforms(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> None:
    # The token is fixed, never generated: every request is made as a member, and a
    # negative case is negative for what it sends, not for a missing token.
    @given(case=operation.as_strategy(generation_mode=mode, headers=headers))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)  # fmt: skip
    def check(case: Any) -> None:
        skip = [ignored_auth, *excluded(operation)]
        if "cursor" in (case.query or {}):
            skip.append(positive_data_acceptance)
        case.call_and_validate(excluded_checks=skip)

    try:
        check()
    except Unsatisfiable:
        # An operation that takes nothing (GET /nodes) has no invalid request to make.
        assert mode is GenerationMode.NEGATIVE and not operation.query and not operation.body


@pytest.fixture
def in_test_transaction() -> Iterator[None]:
    """Requests served in this process keep the test's database connection, as Django's
    test client does (the WSGI handler would close it after each request)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_conforms_to_the_schema(
    mode: GenerationMode, acme: Tenant, live_controller: Any, in_test_transaction: None
) -> None:
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="st")
    headers = {"Authorization": f"Bearer {secret}"}
    failures: dict[str, str] = {}
    checked = 0
    for result in _schema().get_all_operations():
        operation = result.ok()
        try:
            conforms(operation, mode, headers)
        except (Exception, BaseExceptionGroup) as exc:  # every failing operation is reported
            failures[f"{operation.method.upper()} {operation.path}"] = _told(exc)[:3000]
        checked += 1
    assert checked >= 8
    assert not failures, "\n\n".join(f"== {op}\n{why}" for op, why in failures.items())
