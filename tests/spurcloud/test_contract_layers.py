"""The web's layers are built from the job contract and agree with it: the history's
choices, migrations and database constraint; the API's serializers, OpenAPI schema and
URL patterns; the portal's badges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.urls import Resolver404, resolve, reverse
from drf_spectacular.generators import SchemaGenerator

from scheduler.core.contract import (
    GPU_FRACTION,
    JOB_FIELDS,
    SPEC_FIELDS,
    JobAction,
    JobState,
    Kind,
    StateKind,
)
from spurcloud.api.serializers import JobSerializer, JobSpecSerializer, LiveJobSerializer
from spurcloud.jobs.models import JobRecord
from tests.spurcloud.conftest import Tenant

ROOT = Path(__file__).resolve().parents[2]
API_SPEC_FIELDS = [f for f in SPEC_FIELDS if not f.bounds.stamped] + [GPU_FRACTION]


def test_no_migration_is_missing_for_the_contract(db: None) -> None:
    # Fails (SystemExit) when a state or a field changed without its migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_the_history_offers_exactly_the_contracts_states() -> None:
    field = JobRecord._meta.get_field("state")
    assert list(field.choices) == [(s.value, s.label) for s in JobState]
    assert field.max_length >= max(len(s.value) for s in JobState)


def test_the_database_accepts_every_state_and_refuses_any_other(acme: Tenant) -> None:
    for job_id, state in enumerate(JobState, start=1):
        JobRecord.objects.create(
            cluster="c", job_id=job_id, organization=acme.organization, user="u", state=state
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRecord.objects.create(
            cluster="c", job_id=99, organization=acme.organization, user="u", state="BOOT_FAIL"
        )


def test_the_submit_serializer_has_every_spec_field_with_its_bounds() -> None:
    fields = JobSpecSerializer().get_fields()
    assert list(fields) == [f.name for f in API_SPEC_FIELDS]
    for f in API_SPEC_FIELDS:
        got = fields[f.name]
        assert got.help_text == f.help
        assert getattr(got, "allow_null", False) == f.nullable
        if f.kind in (Kind.INTEGER, Kind.NUMBER):
            assert (got.min_value, got.max_value) == (f.bounds.minimum, f.bounds.maximum)
        if f.kind is Kind.STRING:
            assert got.max_length == f.bounds.max_length


def test_the_job_serializers_have_the_contracts_answer_fields() -> None:
    assert list(JobSerializer().get_fields()) == [f.name for f in JOB_FIELDS if f.history]
    assert list(LiveJobSerializer().get_fields()) == [f.name for f in JOB_FIELDS]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def test_the_schema_describes_every_spec_field_with_its_bounds(schema: dict[str, Any]) -> None:
    properties = schema["components"]["schemas"]["JobSpecRequest"]["properties"]
    assert list(properties) == [f.name for f in API_SPEC_FIELDS]
    for f in API_SPEC_FIELDS:
        prop = properties[f.name]
        if f.bounds.minimum is not None:
            assert prop["minimum"] == f.bounds.minimum, f.name
            assert prop["maximum"] == f.bounds.maximum, f.name
        if f.kind is Kind.STRING:
            assert prop["maxLength"] == f.bounds.max_length, f.name
        if f.nullable:
            assert prop.get("nullable") is True, f.name
    assert schema["components"]["schemas"]["JobSpecRequest"]["required"] == ["script"]


def test_the_schemas_enums_are_the_contracts(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    assert components["JobStateEnum"]["enum"] == [s.value for s in JobState]
    job = components["Job"]["properties"]
    assert list(job) == [f.name for f in JOB_FIELDS if f.history]
    # Under a job: its actions (POST), and its output (GET), which is not an action; and
    # its steps (srun, salloc: spurcloud/api/steps.py), which are not actions either.
    actions = [
        p.rsplit("/", 1)[1]
        for p, operations in schema["paths"].items()
        if p.startswith("/api/v1/jobs/{") and "post" in operations and "/steps" not in p
    ]
    assert actions == [a.value for a in JobAction]
    for action in JobAction:
        operation = schema["paths"][f"/api/v1/jobs/{{job_id}}/{action.value}"]["post"]
        assert operation["operationId"] == f"jobs_{action.value}"
        assert operation["summary"] == action.help
        assert ("requestBody" in operation) == action.takes_signal
        assert {"200", "400", "401", "403", "404", "409", "429", "503"} <= set(
            operation["responses"]
        )


def test_every_action_has_a_route_and_nothing_else_does() -> None:
    for action in JobAction:
        url = reverse(f"api:job-{action.value}", kwargs={"job_id": 7})
        assert url == f"/api/v1/jobs/7/{action.value}"
        assert resolve(url).kwargs == {"job_id": 7, "action": action}
    assert resolve("/api/v1/jobs/7/explode").url_name == "not-found"
    with pytest.raises(Resolver404):
        resolve("/nowhere-at-all/")


def test_the_portal_has_a_badge_for_every_kind_of_state() -> None:
    css = (ROOT / "static" / "css" / "spur.css").read_text()
    for kind in StateKind:
        assert f".state-{kind.value}" in css, kind
