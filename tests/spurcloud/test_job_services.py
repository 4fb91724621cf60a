"""Job selectors and the checks the job services make before calling the controller."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404

from scheduler.core.contract import JobAction, JobState
from spurcloud.jobs.errors import JobRejected
from spurcloud.jobs.models import ACTIVE_STATES, TERMINAL_STATES, JobRecord
from spurcloud.jobs.selectors import access_job, jobs_changed_since
from spurcloud.jobs.services import act_on_job, parse_spec, record_job_event, submit_job
from spurcloud.portal.views import DASHBOARD_JOBS
from tests.spurcloud.conftest import Tenant, event, job_dict, make_user


def test_job_states_fall_into_active_and_terminal_groups() -> None:
    assert {"PENDING", "RUNNING", "COMPLETING", "SUSPENDED"} == ACTIVE_STATES
    assert {s.value for s in JobState} - ACTIVE_STATES == TERMINAL_STATES
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY"} == TERMINAL_STATES  # fmt: skip
    assert JobRecord(state=JobState.RUNNING).is_active


def test_access_job_gives_the_same_404_for_missing_and_foreign_jobs(
    acme: Tenant, globex: Tenant
) -> None:
    record_job_event(event=event(job_dict(8, tenant="acme", user="max")))
    assert access_job(organization=acme.organization, job_id=8).job_id == 8
    with pytest.raises(Http404) as foreign:
        access_job(organization=globex.organization, job_id=8)
    with pytest.raises(Http404) as missing:
        access_job(organization=globex.organization, job_id=8000)
    assert str(foreign.value) == "Job 8 not found."
    assert str(missing.value) == "Job 8000 not found."


def test_only_members_submit_to_an_organisation(acme: Tenant, globex: Tenant) -> None:
    with pytest.raises(PermissionDenied):
        submit_job(organization=acme.organization, user=globex.owner, spec={"script": "x"})


def test_an_invalid_spec_is_rejected_before_the_controller_is_asked(
    acme: Tenant, settings: Any
) -> None:
    settings.SPUR_CONTROLLER_URLS = ["http://127.0.0.1:9"]  # would be a 503 if it were asked
    with pytest.raises(JobRejected, match="unknown job field"):
        submit_job(organization=acme.organization, user=acme.member, spec={"script": "x", "gpu": 1})


@pytest.mark.parametrize("who", ["owner", "member"])
def test_a_negative_nice_is_refused_to_tenants_naming_the_field(
    who: str, acme: Tenant, settings: Any
) -> None:
    settings.SPUR_CONTROLLER_URLS = ["http://127.0.0.1:9"]  # would be a 503 if it were asked
    user = getattr(acme, who)
    for operator in (False, True):  # claiming to be an operator takes being staff
        with pytest.raises(JobRejected) as refused:
            submit_job(
                organization=acme.organization,
                user=user,
                spec={"script": "x", "nice": -1},
                operator=operator,
            )
        assert refused.value.field == "nice"
        assert refused.value.message.startswith("nice: a negative nice")


def test_an_operator_may_set_a_negative_nice_and_anyone_a_positive_one(acme: Tenant) -> None:
    staff = make_user("root", staff=True)
    spec = {"script": "x", "nice": -50}
    assert (
        parse_spec(organization=acme.organization, user=staff, spec=spec, operator=True).nice == -50
    )
    with pytest.raises(JobRejected):  # staff, but not acting as an operator
        parse_spec(organization=acme.organization, user=staff, spec=spec)
    positive = {"script": "x", "nice": 50}
    assert parse_spec(organization=acme.organization, user=acme.member, spec=positive).nice == 50


def test_only_members_cancel_and_foreign_jobs_are_missing(acme: Tenant, globex: Tenant) -> None:
    record_job_event(event=event(job_dict(8, tenant="acme", user="max")))
    with pytest.raises(PermissionDenied):
        act_on_job(
            organization=acme.organization, user=globex.owner, job_id=8, action=JobAction.CANCEL
        )
    with pytest.raises(Http404):
        act_on_job(
            organization=globex.organization, user=globex.owner, job_id=8, action=JobAction.CANCEL
        )


def test_changes_since_a_sequence_number_come_oldest_first(acme: Tenant, globex: Tenant) -> None:
    for job_id, seq in [(1, 10), (2, 30), (3, 20)]:
        record_job_event(event=event(job_dict(job_id, tenant="acme", user="max"), seq=seq))
    record_job_event(event=event(job_dict(4, tenant="globex", user="oscar"), seq=40))
    changed = jobs_changed_since(organization_id=acme.organization.pk, seq=15)
    assert [(r.job_id, r.last_seq) for r in changed] == [(3, 20), (2, 30)]


def test_the_dashboard_costs_the_same_queries_for_many_jobs(
    acme: Tenant, client: Any, django_assert_max_num_queries: Any
) -> None:
    for job_id in range(1, 51):
        record_job_event(event=event(job_dict(job_id, tenant="acme", user="max")))
    client.force_login(acme.member)
    client.get("/")
    # session, user, selected membership, the user's memberships (switcher), one page of
    # active jobs, the active sessions, the price book (the catalog's prices), the recent
    # activity, whether the organisation has any job (first run): none per job
    with django_assert_max_num_queries(9):
        response = client.get("/")
    assert response.content.count(b"data-job-id=") == DASHBOARD_JOBS


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"stdout": "/etc/x"}, "stdout"),
        ({"workdir": "/root"}, "workdir"),
        ({"stdin": "/var/lib/spur/cluster-token"}, "stdin"),
        ({"stderr": "../../../globex/slurm-1.out"}, "stderr"),
        ({"workdir": "../globex"}, "workdir"),
    ],
)
@pytest.mark.parametrize("who", ["owner", "member"])
def test_a_path_outside_the_organisations_workspace_is_refused_at_submit(
    who: str, fields: dict[str, str], field: str, acme: Tenant, settings: Any, tmp_path: Any
) -> None:
    settings.SPUR_CONTROLLER_URLS = ["http://127.0.0.1:9"]  # would be a 503 if it were asked
    settings.SPUR_WORK_ROOT = tmp_path
    with pytest.raises(JobRejected) as refused:
        submit_job(
            organization=acme.organization,
            user=getattr(acme, who),
            spec={"script": "#!/bin/sh\n", **fields},
        )
    assert refused.value.field == field
    assert f"outside your organisation's workspace {tmp_path / 'acme'}" in str(refused.value)


def test_paths_inside_the_workspace_pass_the_submit_check(
    acme: Tenant, settings: Any, tmp_path: Any
) -> None:
    settings.SPUR_WORK_ROOT = tmp_path
    spec = parse_spec(
        organization=acme.organization,
        user=acme.member,
        spec={
            "script": "#!/bin/sh\n",
            "workdir": str(tmp_path / "acme" / "runs"),
            "stdout": "logs/%x-%j.out",
            "stdin": "/dev/null",
        },
    )
    assert spec.workdir == str(tmp_path / "acme" / "runs")
