"""A submission's estimated cost (price x resources x time limit) is checked against a prepaid
balance on every path, not only in the portal's form: the API (one job and a list)
answers 402 with both amounts, and `sbatch` prints that message and exits 1; an invoiced
organisation is not held to its balance. Against a real controller, whose partition
gives a job without a time limit its default (60 min)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from scheduler.cli import sbatch
from spurcloud.billing.models import PriceEntry
from spurcloud.billing.services import set_billing_mode
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.services import create_api_token
from tests.billing.conftest import Tenant

pytestmark = pytest.mark.django_db
SCRIPT = "#!/bin/sh\ntrue\n"
# Sign-up credit: 10.00 USD. h100: 2.50 USD per GPU-hour (the `prices` fixture).


def _job(**fields: Any) -> dict[str, Any]:
    return {"script": SCRIPT, "gpus_per_node": 1, "hold": True, **fields}


def test_a_job_that_may_cost_more_than_the_balance_is_refused_with_402(
    acme: Tenant, as_member: APIClient, live_controller: Any, prices: list[PriceEntry]
) -> None:
    response = as_member.post("/api/v1/jobs", _job(time_limit_min=600), format="json")
    assert response.status_code == 402, response.content
    body = response.json()
    assert body["code"] == "payment_required"
    assert "this job may cost up to 25.00 USD" in body["detail"]
    assert "balance of 10.00 USD" in body["detail"]
    assert not JobRecord.objects.exists()


def test_without_a_time_limit_or_a_model_the_estimate_is_the_partition_default_and_dearest_model(
    acme: Tenant, as_member: APIClient, live_controller: Any, prices: list[PriceEntry]
) -> None:
    # 4 GPUs (any model: the cluster has h100, 2.50) for the default 60 min: 10.00, covered.
    assert (
        as_member.post("/api/v1/jobs", _job(gpus_per_node=0, gpus=4), format="json").status_code
        != 402
    )
    # 5 GPUs: 12.50, not covered (refused before the controller hears of it).
    response = as_member.post("/api/v1/jobs", _job(gpus_per_node=0, gpus=5), format="json")
    assert response.status_code == 402
    assert "12.50 USD" in response.json()["detail"]


def test_a_list_of_jobs_is_checked_together(
    acme: Tenant, as_member: APIClient, live_controller: Any, prices: list[PriceEntry]
) -> None:
    two = [_job(time_limit_min=120)] * 2  # 5.00 each: 10.00 together
    assert as_member.post("/api/v1/jobs", two, format="json").status_code == 201
    three = [_job(time_limit_min=120)] * 3
    response = as_member.post("/api/v1/jobs", three, format="json")
    assert response.status_code == 402 and "15.00 USD" in response.json()["detail"]
    assert JobRecord.objects.count() == 2


def test_an_invoiced_organisation_is_not_refused_for_its_estimate(
    acme: Tenant, as_member: APIClient, live_controller: Any, prices: list[PriceEntry]
) -> None:
    set_billing_mode(organization=acme.organization, mode="postpaid")
    response = as_member.post("/api/v1/jobs", _job(time_limit_min=600), format="json")
    assert response.status_code == 201, response.content


def test_jobs_without_gpus_or_a_price_are_not_estimated(
    acme: Tenant, as_member: APIClient, live_controller: Any
) -> None:
    # No price book: nothing to estimate, nothing refused for it.
    response = as_member.post("/api/v1/jobs", _job(time_limit_min=6000), format="json")
    assert response.status_code == 201, response.content


@pytest.mark.django_db(transaction=True)
def test_sbatch_prints_the_apis_402_message_and_exits_non_zero(
    acme: Tenant,
    live_server: Any,
    live_controller: Any,
    prices: list[PriceEntry],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="cli")
    monkeypatch.setenv("SPUR_API_URL", live_server.url)
    monkeypatch.setenv("SPUR_TOKEN", secret)
    monkeypatch.setenv("SPUR_USER", acme.member.get_username())
    code = sbatch.main(["-t", "10:00:00", "--gres=gpu:1", "-H", "--wrap", "true"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith(
        "sbatch: error: Batch job submission failed: Payment required: this job may cost up to "
        "25.00 USD (price x resources x time limit), more than your balance of 10.00 USD."
    )
    assert not JobRecord.objects.exists()
