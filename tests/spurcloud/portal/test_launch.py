"""/launch/: a batch job from the browser, through the same service as POST /api/v1/jobs
against a real controller (one node, one H100): the scheduler's own messages, shown by
the field they name, and nothing typed lost."""

from __future__ import annotations

import re
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from rest_framework.test import APIClient

from scheduler.slurm.batchscript import wrap_script
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import BILLING_ROLE_MESSAGE
from spurcloud.tenants.selectors import UNCONFIRMED_EMAIL_MESSAGE
from tests.spurcloud.portal.conftest import RUNNERS, browser


def _form(client: Any) -> dict[str, str]:
    page = client.get("/launch/").content.decode()
    key = re.search(r'name="idempotency_key" value="([0-9a-f]{32})"', page)
    assert key is not None
    return {"idempotency_key": key.group(1)}


def _errors(page: str) -> list[str]:
    return re.findall(r'<span class="errors" role="alert">([^<]*)</span>', page)


@pytest.mark.parametrize("who", RUNNERS)
def test_a_member_launches_a_command_on_a_gpu_model_and_lands_on_its_page(
    who: str, people: dict[str, Any], live_controller: Any
) -> None:
    client = browser(people[who])
    page = client.get("/launch/").content.decode()
    assert '<option value="h100">h100</option>' in page  # the cluster's GPU models
    assert '<option value="gpu">gpu</option>' in page  # and partitions
    for field in ("command", "script", "gpu_type", "gpus", "gpu_fraction", "time_limit_min"):
        assert f'<label for="id_{field}">' in page  # every input has its label
    data = {
        **_form(client),
        "name": "smoke",
        "command": "nvidia-smi",
        "gpu_type": "h100",
        "gpus": "1",
        "time_limit_min": "10",
        "partition": "gpu",
    }
    response = client.post("/launch/", data)
    assert response.status_code == 302
    job_id = int(response["Location"].strip("/").rsplit("/", 1)[-1])
    assert response["Location"] == f"/jobs/{job_id}/"
    record = JobRecord.objects.get(job_id=job_id)
    assert record.organization.slug == "acme" and record.user == people[who].username
    assert record.spec is not None
    assert record.spec["script"] == wrap_script("nvidia-smi")
    assert (record.spec["gpu_type"], record.spec["gpus"], record.time_limit_min) == ("h100", 1, 10)
    # The same POST again (a double click, a resend) is the same job.
    again = client.post("/launch/", data)
    assert again["Location"] == f"/jobs/{job_id}/"
    assert JobRecord.objects.filter(name="smoke").count() == 1


def test_a_share_of_one_gpu(people: dict[str, Any], live_controller: Any) -> None:
    client = browser(people["member"])
    response = client.post(
        "/launch/", {**_form(client), "command": "python notebook.py", "gpu_fraction": "0.25"}
    )
    assert response.status_code == 302
    assert JobRecord.objects.get(name="wrap").spec["gpu_milli"] == 250  # type: ignore[index]


def test_the_schedulers_message_is_shown_by_its_field_and_matches_the_apis(
    people: dict[str, Any], live_controller: Any, as_member: APIClient
) -> None:
    client = browser(people["member"])
    data = {**_form(client), "command": "train", "gpus": "1", "gpu_fraction": "0.5"}
    response = client.post("/launch/", data)
    assert response.status_code == 200
    page = response.content.decode()
    api = as_member.post(
        "/api/v1/jobs",
        {"script": "#!/bin/sh\ntrain\n", "gpus": 1, "gpu_fraction": 0.5},
        format="json",
    )
    assert api.status_code == 400
    message = api.json()["detail"]
    assert "gpu_milli is a share of one GPU" in message
    assert _errors(page) == [message]
    assert 'value="train"' in page  # nothing typed is lost
    assert not JobRecord.objects.exists()


def test_the_controllers_refusal_is_shown(people: dict[str, Any], live_controller: Any) -> None:
    client = browser(people["member"])
    response = client.post("/launch/", {**_form(client), "command": "big", "gpus": "4"})
    assert response.status_code == 200
    assert b"Requested node configuration is not available" in response.content
    assert b'value="big"' in response.content
    assert not JobRecord.objects.exists()


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({}, None, "Give a command to run, or a batch script."),
        (
            {"command": "a", "script": "#!/bin/sh\nb\n"},
            None,
            "Give a command or a script, not both.",
        ),
        ({"script": "echo hi"}, "script", "This does not look like a batch script."),
        ({"command": "a", "time_limit_min": "-5"}, "time_limit_min", "time_limit_min"),
        ({"command": "a", "gpus": "two"}, "gpus", "Enter a whole number."),
        ({"command": "a", "gpu_type": "tpu"}, "gpu_type", "Select a valid choice."),
    ],
)
def test_bad_input_gets_a_clear_error(
    data: dict[str, str],
    field: str | None,
    message: str,
    people: dict[str, Any],
    live_controller: Any,
) -> None:
    client = browser(people["member"])
    response = client.post("/launch/", {**_form(client), **data})
    assert response.status_code == 200
    page = response.content.decode()
    if field is None:
        assert message in page.split('class="errors"')[1].split("</div>")[0]
    else:
        errors = _errors(page)
        assert any(message in error for error in errors), errors
    assert not JobRecord.objects.exists()


def test_a_billing_member_launches_nothing_and_is_told_why(
    people: dict[str, Any], live_controller: Any
) -> None:
    client = browser(people["billing"])
    assert b"Your role in Acme is billing" in client.get("/launch/").content
    response = client.post("/launch/", {**_form(client), "command": "a"})
    assert response.status_code == 200
    assert BILLING_ROLE_MESSAGE in response.content.decode().replace("&#x27;", "'")
    assert not JobRecord.objects.exists()


def test_someone_who_has_not_confirmed_their_email_is_told_so(
    people: dict[str, Any], live_controller: Any
) -> None:
    EmailAddress.objects.filter(user=people["member"]).update(verified=False)
    client = browser(people["member"])
    response = client.post("/launch/", {**_form(client), "command": "a"})
    assert response.status_code == 200
    assert UNCONFIRMED_EMAIL_MESSAGE in response.content.decode()
    assert not JobRecord.objects.exists()


def test_with_the_scheduler_down_the_form_says_so_and_keeps_what_was_typed(
    people: dict[str, Any],
) -> None:
    client = browser(people["member"])  # no controller (conftest)
    assert b"The scheduler is unreachable" in client.get("/launch/").content
    response = client.post("/launch/", {**_form(client), "command": "keep me"})
    assert response.status_code == 200
    assert b"The scheduler is unreachable" in response.content
    assert b'value="keep me"' in response.content


def test_nobody_signed_in_launches_nothing(db: None) -> None:
    response = browser(None).post("/launch/", {"command": "x"})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
