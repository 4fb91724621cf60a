"""Prices before running anything: the catalog's price per GPU-hour, the launch form's
estimate (price x GPUs x time limit) and its check against a prepaid balance."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from spurcloud.billing.ledger import post_entry
from spurcloud.billing.models import LedgerEntry, PriceEntry, QosClass
from spurcloud.billing.quotes import estimate_micro, partition_limit
from spurcloud.billing.services import set_billing_mode
from spurcloud.jobs.models import JobRecord
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import RUNNERS, browser
from tests.spurcloud.portal.test_launch import _form


@pytest.fixture
def h100_price(db: None) -> PriceEntry:
    return PriceEntry.objects.create(
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        gpu_hour_micro=2_500_000,
    )


def _job(client: Any, **fields: str) -> dict[str, str]:
    return {**_form(client), "command": "nvidia-smi", "gpu_type": "h100", **fields}


def test_the_estimate_rounds_up_to_a_micro_unit() -> None:
    assert estimate_micro(gpu_hour_micro=2_500_000, gpu_milli=2000, time_limit_min=90) == 7_500_000
    assert estimate_micro(gpu_hour_micro=2_500_000, gpu_milli=1, time_limit_min=1) == 42
    parts = [{"name": "gpu", "default": True, "default_time_min": None, "max_time_min": 60}]
    assert partition_limit(parts, "") == 60 and partition_limit(parts, "other") is None


@pytest.mark.parametrize("who", RUNNERS)
def test_the_catalog_and_the_launch_form_show_the_price(
    who: str, people: dict[str, Any], live_controller: Any, h100_price: PriceEntry
) -> None:
    client = browser(people[who])
    assert "<td>2.50 USD</td>" in client.get("/").content.decode()
    assert "On-demand price per GPU-hour: h100 2.50 USD." in client.get("/launch/").content.decode()


def test_estimate_shows_the_cost_and_submits_nothing(
    people: dict[str, Any], live_controller: Any, h100_price: PriceEntry
) -> None:
    client = browser(people["member"])
    data = _job(client, gpus="2", time_limit_min="90", estimate="1")
    page = client.post("/launch/", data).content.decode()
    assert "Estimated cost: at most <strong>7.50 USD</strong>" in page
    assert "2.50 USD per GPU-hour × 2 GPU × 90 min" in page
    assert JobRecord.objects.count() == 0


def test_a_job_that_may_cost_more_than_the_balance_is_refused_before_submit(
    people: dict[str, Any], live_controller: Any, h100_price: PriceEntry
) -> None:
    client = browser(people["member"])
    page = client.post("/launch/", _job(client, gpus="1", time_limit_min="600")).content.decode()
    assert "this job may cost up to 25.00 USD" in page and "balance of 10.00 USD" in page
    assert JobRecord.objects.count() == 0
    response = client.post("/launch/", _job(client, gpus="1", time_limit_min="60"))
    assert response.status_code == 302  # 2.50 USD: affordable


def test_an_invoiced_organisation_is_not_held_to_its_balance(
    acme: Tenant, people: dict[str, Any], live_controller: Any, h100_price: PriceEntry
) -> None:
    set_billing_mode(organization=acme.organization, mode="postpaid")
    client = browser(people["member"])
    response = client.post("/launch/", _job(client, gpus="1", time_limit_min="600"))
    assert response.status_code == 302


def test_used_up_credit_is_said_in_the_form(
    acme: Tenant, people: dict[str, Any], live_controller: Any
) -> None:
    post_entry(
        organization=acme.organization,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micro=-10_000_000,
        key="zero",
        description="x",
    )
    client = browser(people["member"])
    response = client.post("/launch/", _job(client, gpus="1"))
    assert response.status_code == 200
    assert "Payment required: your organisation&#x27;s prepaid credit is used up" in (
        response.content.decode()
    )
    assert JobRecord.objects.count() == 0
