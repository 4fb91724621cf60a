"""terminal_grant (spurcloud/portal/session_terminal.py) against a real controller: the
session's user, owners and admins get the controller's token for the session's node;
billing members, another organisation and a batch job get nothing."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404

from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.services import submit_job
from spurcloud.portal.session_terminal import TerminalUnavailable, terminal_grant
from spurcloud.portal.sessions import session_templates
from spurcloud.tenants.models import Membership
from tests.fixtures.processes import wait_until
from tests.spurcloud.portal.conftest import RUNNERS


def _start(
    people: dict[str, Any], *, gpus: int = 1, batch: bool = False, who: str = "member"
) -> int:
    member = Membership.objects.get(user=people[who])
    spec: dict[str, Any] = {"script": session_templates()["shell"].script(30), "gpus": gpus}
    if not batch:
        spec.update(qos="interactive", comment="spur-session:shell", time_limit_min=30)
    job = submit_job(organization=member.organization, user=people[who], spec=spec)
    return int(job["job_id"])


def _running(job_id: int) -> int:
    """Waits for the leader's pass to start the job (it runs after the submission returns)."""
    wait_until(
        lambda: controller_client().job(job_id)["state"] == "RUNNING", timeout=10, what="running"
    )
    return job_id


def _grant(who: str, people: dict[str, Any], job_id: int) -> dict[str, Any]:
    membership = Membership.objects.filter(user=people[who]).first()
    assert membership is not None
    return terminal_grant(membership=membership, job_id=job_id)


def _fields(token: str) -> dict[str, Any]:
    body = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))


@pytest.mark.parametrize("who", RUNNERS)
def test_the_sessions_user_owners_and_admins_get_a_token_for_its_node(
    who: str, people: dict[str, Any], live_controller: Any
) -> None:
    job_id = _running(_start(people))
    grant = _grant(who, people, job_id)
    assert grant["node"] == "node01" and grant["token"].startswith("spur-term.")
    fields = _fields(grant["token"])
    assert (fields["job_id"], fields["tenant"]) == (job_id, "acme")
    assert fields["user"] == people[who].username


def test_billing_and_another_organisation_get_nothing(
    people: dict[str, Any], live_controller: Any
) -> None:
    job_id = _start(people)
    with pytest.raises(PermissionDenied):
        _grant("billing", people, job_id)
    with pytest.raises(Http404):
        _grant("outsider", people, job_id)


def test_a_batch_job_and_a_pending_session_have_no_terminal(
    people: dict[str, Any], live_controller: Any
) -> None:
    batch = _running(_start(people, batch=True))
    with pytest.raises(Http404):
        _grant("member", people, batch)
    pending = _start(people)  # the node's one GPU is the batch job's
    with pytest.raises(TerminalUnavailable, match="not running"):
        _grant("member", people, pending)


def test_with_the_scheduler_down_it_says_so(people: dict[str, Any], live_controller: Any) -> None:
    job_id = _start(people)
    live_controller.stop()
    with pytest.raises(TerminalUnavailable, match="unreachable"):
        _grant("member", people, job_id)


def test_a_member_gets_no_terminal_in_someone_elses_session(
    people: dict[str, Any], live_controller: Any
) -> None:
    job_id = _running(_start(people, who="admin"))
    with pytest.raises(PermissionDenied, match="your own sessions"):
        _grant("member", people, job_id)
    assert _grant("owner", people, job_id)["node"] == "node01"
