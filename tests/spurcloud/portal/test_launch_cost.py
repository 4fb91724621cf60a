"""Prices before running anything: the catalog's on-demand and spot prices per GPU-hour,
the launch form's estimate (price x resources x time limit, in the job's QoS class) and
its check against a prepaid balance, for batch jobs and sessions alike."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from spurcloud.billing.ledger import post_entry
from spurcloud.billing.models import LedgerEntry, PriceEntry, QosClass
from spurcloud.billing.quotes import Holds, Rates, estimate_micro, partition_limit
from spurcloud.billing.services import set_billing_mode
from spurcloud.jobs.models import JobRecord
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import RUNNERS, browser
from tests.spurcloud.portal.test_launch import _form
from tests.spurcloud.portal.test_sessions import _launch_data


@pytest.fixture
def h100_price(db: None) -> PriceEntry:
    return PriceEntry.objects.create(
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        gpu_hour_micro=2_500_000,
    )


@pytest.fixture
def h100_spot(db: None) -> PriceEntry:
    return PriceEntry.objects.create(
        gpu_model="h100",
        qos_class=QosClass.SPOT,
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        gpu_hour_micro=1_000_000,
    )


def _used_up(tenant: Tenant) -> None:
    post_entry(
        organization=tenant.organization,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micro=-10_000_000,
        key="zero",
        description="x",
    )


def _job(client: Any, **fields: str) -> dict[str, str]:
    return {**_form(client), "command": "nvidia-smi", "gpu_type": "h100", **fields}


def test_the_estimate_rounds_up_to_a_micro_unit() -> None:
    h100 = Rates(gpu_hour_micro=2_500_000)
    assert estimate_micro(rates=h100, holds=Holds(2000), time_limit_min=90) == 7_500_000
    assert estimate_micro(rates=h100, holds=Holds(1), time_limit_min=1) == 42
    # CPUs and memory too: 1 CPU at 0.02 and 4,000 MiB at 0.005 per GiB-hour, 90 min.
    priced = Rates(2_500_000, cpu_hour_micro=20_000, mem_gb_hour_micro=5_000)
    holds = Holds(2000, cpus=1, mem_mb=4000)
    assert estimate_micro(rates=priced, holds=holds, time_limit_min=90) == 7_559_297
    parts = [{"name": "gpu", "default": True, "default_time_min": None, "max_time_min": 60}]
    assert partition_limit(parts, "") == 60 and partition_limit(parts, "other") is None


@pytest.mark.parametrize("who", RUNNERS)
def test_the_catalog_and_the_launch_form_show_the_price(
    who: str, people: dict[str, Any], live_controller: Any, h100_price: PriceEntry
) -> None:
    client = browser(people[who])
    assert '<td>2.50 USD <span class="hint">spot —</span></td>' in client.get("/").content.decode()
    page = client.get("/launch/").content.decode()
    assert "Price per GPU-hour, on-demand / spot: h100 2.50 USD / —." in page


def test_spot_prices_show_and_a_spot_job_is_estimated_at_the_spot_price(
    people: dict[str, Any], live_controller: Any, h100_price: PriceEntry, h100_spot: PriceEntry
) -> None:
    client = browser(people["member"])
    assert '<td>2.50 USD <span class="hint">spot 1.00 USD</span></td>' in (
        client.get("/").content.decode()
    )
    page = client.get("/launch/").content.decode()
    assert "h100 2.50 USD / 1.00 USD" in page
    assert '<option value="spot">Spot (preemptible)</option>' in page
    data = _job(client, gpus="2", time_limit_min="90", qos="spot", estimate="1")
    assert (
        "Estimated cost: at most <strong>3.00 USD</strong>"
        in client.post("/launch/", data).content.decode()
    )
    # Submitted spot, the job is one: what the estimate priced is what runs (and bills).
    response = client.post("/launch/", _job(client, gpus="1", time_limit_min="90", qos="spot"))
    assert response.status_code == 302
    assert JobRecord.objects.get().qos == "spot"


def test_the_estimate_counts_cpu_and_memory_prices(
    people: dict[str, Any], live_controller: Any
) -> None:
    PriceEntry.objects.create(
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        gpu_hour_micro=2_500_000,
        cpu_hour_micro=20_000,
        mem_gb_hour_micro=5_000,
    )
    client = browser(people["member"])
    # One CPU, and the memory the node gives it: 64,000 MB over 16 CPUs, 4,000 MiB.
    data = _job(client, gpus="2", time_limit_min="90", estimate="1")
    page = client.post("/launch/", data).content.decode()
    assert "Estimated cost: at most <strong>7.559297 USD</strong>" in page
    assert (
        "(2.50 USD per GPU-hour × 2 GPU + 0.02 USD per CPU-hour × 1 CPU + 0.005 USD per "
        "GiB-hour × 3.90625 GiB) × 90 min"
    ) in page


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
    _used_up(acme)
    client = browser(people["member"])
    response = client.post("/launch/", _job(client, gpus="1"))
    assert response.status_code == 402
    assert "Payment required: your organisation&#x27;s prepaid credit is used up" in (
        response.content.decode()
    )
    assert JobRecord.objects.count() == 0


def test_a_session_at_zero_balance_is_refused_with_the_message_and_starts_nothing(
    acme: Tenant, people: dict[str, Any], live_controller: Any
) -> None:
    _used_up(acme)
    client = browser(people["member"])
    response = client.post("/sessions/launch", _launch_data(client))
    assert response.status_code == 402
    page = response.content.decode()
    assert "Payment required: your organisation&#x27;s prepaid credit is used up" in page
    assert JobRecord.objects.count() == 0


def test_a_session_that_may_cost_more_than_the_balance_is_refused(
    people: dict[str, Any], live_controller: Any, h100_price: PriceEntry
) -> None:
    client = browser(people["member"])
    data = _launch_data(client, **{"session-gpu_type": "h100", "session-max_minutes": "300"})
    response = client.post("/sessions/launch", data)
    assert response.status_code == 402
    page = response.content.decode()
    assert "this job may cost up to 12.50 USD" in page and "balance of 10.00 USD" in page
    assert JobRecord.objects.count() == 0
    short = _launch_data(client, **{"session-gpu_type": "h100", "session-max_minutes": "60"})
    assert client.post("/sessions/launch", short).status_code == 302
