"""/jobs/<id>/: a job's state and reason, allocation, times in the viewer's zone, exit as
sacct prints it, the output's live tail (its websocket path) and download links, and the
contract's actions, which go through the API's own service against a real controller."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from scheduler.client import JobReport
from scheduler.core.contract import JobAction
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import BILLING_ROLE_MESSAGE, submit_job
from tests.fixtures.processes import wait_until
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import ROLES, browser, record

SUBMIT = 1_764_576_005.0  # 2025-12-01 08:00:05 UTC: 09:00:05 in Paris (CET)


def _running(job_id: int = 41) -> None:
    record(
        job_id,
        state="RUNNING",
        reason="None",
        nodes=["node01"],
        allocation={"node01": {"gpus": [2, 3], "cpus": 8, "mem_mb": 65536}},
        submit_time=SUBMIT,
        start_time=SUBMIT + 60,
    )


@pytest.mark.parametrize("who", ROLES)
def test_members_see_state_allocation_times_and_the_output_tail(
    who: str, people: dict[str, Any]
) -> None:
    _running()
    response = browser(people[who]).get("/jobs/41/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'class="state state-running" id="job-state">RUNNING<' in page
    assert '<dd id="job-reason"></dd>' in page  # "None" says nothing: shown blank
    assert "<td>node01</td>" in page and "<td>2, 3</td>" in page and "<td>64 GiB</td>" in page
    assert "2025-12-01 08:00:05 UTC" in page  # no zone known yet: UTC, said so
    assert 'data-ws-path="/ws/jobs/41/output/"' in page
    assert 'href="/jobs/41/stdout"' in page and 'href="/jobs/41/stderr"' in page
    assert "job-output.js" in page
    if who == "billing":  # sees the job, controls none
        assert 'action="/jobs/41/' not in page
        return
    for action in JobAction:  # an active job: each of the contract's actions, by POST
        assert f'action="/jobs/41/{action.value}"' in page
    assert page.count('name="csrfmiddlewaretoken"') >= len(JobAction)


def test_times_are_shown_in_the_viewers_time_zone_with_the_zone(people: dict[str, Any]) -> None:
    _running()
    client = browser(people["member"])
    client.cookies["spur_tz"] = "Europe/Paris"
    page = client.get("/jobs/41/").content.decode()
    assert "2025-12-01 09:00:05 CET" in page and "2025-12-01 09:01:05 CET" in page
    client.cookies["spur_tz"] = "Mars/Olympus_Mons"  # not a zone: UTC
    assert "2025-12-01 08:00:05 UTC" in client.get("/jobs/41/").content.decode()


def test_an_ended_job_shows_its_exit_as_sacct_does_and_offers_no_actions(
    people: dict[str, Any],
) -> None:
    record(43, state="FAILED", exit_code=0, signal=15, nodes=["node01"])
    page = browser(people["member"]).get("/jobs/43/").content.decode()
    assert '<dd id="job-exit">0:15</dd>' in page
    assert 'action="/jobs/43/cancel"' not in page


def test_another_organisations_job_is_the_same_404_as_a_missing_one(
    people: dict[str, Any],
) -> None:
    _running()
    outsider = browser(people["outsider"])
    foreign, missing = outsider.get("/jobs/41/"), outsider.get("/jobs/999/")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.content == missing.content
    assert b"node01" not in foreign.content
    # An id too long for any job is a 404 too, never a database error.
    assert outsider.get("/jobs/" + "9" * 25 + "/").status_code == 404


def test_nobody_signed_in_is_sent_to_sign_in(people: dict[str, Any]) -> None:
    _running()
    for method, path in (("get", "/jobs/41/"), ("post", "/jobs/41/cancel")):
        response = getattr(browser(None), method)(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/")


# -- actions, against a real controller ---------------------------------------------------


@pytest.fixture
def held_job(acme: Tenant, live_controller: Any) -> int:
    """The owner's job, submitted held (it waits until released)."""
    job = submit_job(
        organization=acme.organization,
        user=acme.owner,
        spec={"script": "#!/bin/sh\ntrue\n", "hold": True, "name": "held"},
    )
    return int(job["job_id"])


def _act(client: Client, job_id: int, action: str) -> str:
    response = client.post(f"/jobs/{job_id}/{action}", follow=True)
    assert response.redirect_chain[0] == (f"/jobs/{job_id}/", 302)
    return response.content.decode()


@pytest.mark.parametrize("who", ["owner", "admin"])
def test_owners_and_admins_release_a_held_job_through_the_service(
    who: str, people: dict[str, Any], held_job: int, live_controller: Any
) -> None:
    page = _act(browser(people[who]), held_job, "release")
    assert f"Job {held_job}: release requested." in page
    assert JobRecord.objects.get(job_id=held_job).reason != "JobHeldUser"
    client = live_controller.client()
    try:
        assert client.job(held_job, tenant="acme")["reason"] != "JobHeldUser"
    finally:
        client.close()


def test_a_member_is_told_they_may_act_only_on_their_own_jobs(
    people: dict[str, Any], held_job: int
) -> None:
    page = _act(browser(people["member"]), held_job, "cancel")
    assert "You can cancel only your own jobs." in page
    assert JobRecord.objects.get(job_id=held_job).state == "PENDING"


def test_a_billing_member_is_told_they_control_no_jobs(
    people: dict[str, Any], held_job: int
) -> None:
    page = _act(browser(people["billing"]), held_job, "cancel")
    assert BILLING_ROLE_MESSAGE in page.replace("&#x27;", "'")
    assert JobRecord.objects.get(job_id=held_job).state == "PENDING"


def test_a_refusal_of_the_scheduler_is_shown_in_its_words(
    people: dict[str, Any], held_job: int
) -> None:
    page = _act(browser(people["owner"]), held_job, "requeue")  # it does not run
    assert f"Job {held_job}: " in page and 'class="error"' in page
    assert JobRecord.objects.get(job_id=held_job).state == "PENDING"


def test_an_outsider_cannot_act_on_the_job(people: dict[str, Any], held_job: int) -> None:
    response = browser(people["outsider"]).post(f"/jobs/{held_job}/cancel")
    assert response.status_code == 404
    assert JobRecord.objects.get(job_id=held_job).state == "PENDING"


def test_actions_need_a_post_with_the_csrf_token(people: dict[str, Any], held_job: int) -> None:
    assert browser(people["owner"]).get(f"/jobs/{held_job}/cancel").status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(people["owner"])
    assert strict.post(f"/jobs/{held_job}/cancel").status_code == 403
    assert JobRecord.objects.get(job_id=held_job).state == "PENDING"


def test_the_owner_cancels_their_job(people: dict[str, Any], held_job: int) -> None:
    page = _act(browser(people["owner"]), held_job, "cancel")
    assert f"Job {held_job}: cancel requested." in page
    assert 'class="state state-stopped" id="job-state">CANCELLED<' in page


def _submit(user: Any, acme: Tenant, **spec: Any) -> int:
    job = submit_job(
        organization=acme.organization,
        user=user,
        spec={"script": "#!/bin/sh\nsleep 600\n", "gpus": 1, **spec},
    )
    return int(job["job_id"])


def _controller_job(live_controller: Any, job_id: int) -> dict[str, Any]:
    client = live_controller.client()
    try:
        job: dict[str, Any] = client.job(job_id, tenant="acme")
        return job
    finally:
        client.close()


@pytest.mark.parametrize("who", ["owner", "admin", "member"])
def test_a_runner_holds_their_waiting_job_from_the_page(
    who: str, acme: Tenant, people: dict[str, Any], live_controller: Any
) -> None:
    _submit(acme.owner, acme)  # the node's one GPU: the next job waits for it
    job_id = _submit(people[who], acme, name="waits")
    assert _controller_job(live_controller, job_id)["state"] == "PENDING"
    page = _act(browser(people[who]), job_id, "hold")
    assert f"Job {job_id}: hold requested." in page and 'class="error"' not in page
    assert _controller_job(live_controller, job_id)["reason"] == "JobHeldUser"
    assert '<dd id="job-reason">JobHeldUser</dd>' in page  # the page as the history has it
    assert JobRecord.objects.get(job_id=job_id).reason == "JobHeldUser"


def test_the_owner_requeues_a_members_running_job_from_the_page(
    acme: Tenant, people: dict[str, Any], live_controller: Any
) -> None:
    job_id = _submit(acme.member, acme, name="long")
    # The pass that starts it follows the submission's commit (not within it).
    wait_until(lambda: _controller_job(live_controller, job_id)["state"] == "RUNNING")
    page = _act(browser(people["owner"]), job_id, "requeue")
    assert f"Job {job_id}: requeue requested." in page and 'class="error"' not in page
    # Its processes are stopped (the node's agent reports them gone, as it would)...
    assert _controller_job(live_controller, job_id)["state"] == "COMPLETING"
    client = live_controller.client()
    try:
        client.report(
            JobReport(kind="finished", job_id=job_id, attempt=1, node="node01", signal=15)
        )
    finally:
        client.close()
    # ...and it is back in the queue for another attempt, not ended.
    job = _controller_job(live_controller, job_id)
    assert job["end_time"] is None
    # Pending, or already placed again (the node is free): then as its second attempt.
    assert (job["state"], job["attempt"]) in (("PENDING", 1), ("RUNNING", 2))
