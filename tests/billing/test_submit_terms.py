"""What a submission reads of its organisation's billing (`quotes.submit_terms`): the
account's mode and balance and, for a prepaid one, the prices in effect, in one
statement, read afresh for every submission: the same answers as the account and
`hour_prices` read apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from spurcloud.billing.ledger import open_account, post_entry
from spurcloud.billing.models import BillingAccount, LedgerEntry, PriceEntry, QosClass
from spurcloud.billing.quotes import Rates, SubmitTerms, hour_prices, submit_terms
from spurcloud.billing.services import set_billing_mode
from tests.billing.conftest import H100_PRICE, Tenant

pytestmark = pytest.mark.django_db


def test_a_prepaid_account_is_read_with_the_prices_in_effect_now(
    acme: Tenant, prices: list[PriceEntry]
) -> None:
    open_account(organization=acme.organization)
    # A newer h100 price in effect, and one not yet: the newer wins, the future one waits.
    PriceEntry.objects.create(
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        effective_from=timezone.now() - timedelta(minutes=1),
        gpu_hour_micro=3_000_000,
        cpu_hour_micro=7,
        mem_gb_hour_micro=9,
    )
    PriceEntry.objects.create(
        gpu_model="h100", qos_class=QosClass.ON_DEMAND,
        effective_from=timezone.now() + timedelta(days=1), gpu_hour_micro=9_000_000,
    )  # fmt: skip
    terms = submit_terms(organization=acme.organization)
    assert terms == SubmitTerms("prepaid", 10_000_000, hour_prices())
    assert terms.prices[("h100", QosClass.ON_DEMAND)] == Rates(3_000_000, 7, 9)
    assert terms.prices[("", QosClass.ON_DEMAND)] == Rates(1_800_000)
    assert len(terms.prices) == 3


@pytest.mark.parametrize("mode", ["postpaid", "exempt"])
def test_an_account_not_held_to_its_balance_reads_no_prices(
    acme: Tenant, prices: list[PriceEntry], mode: str
) -> None:
    set_billing_mode(organization=acme.organization, mode=mode)
    assert submit_terms(organization=acme.organization) == SubmitTerms(mode, 10_000_000, {})


def test_a_prepaid_account_without_a_price_book_reads_no_prices(acme: Tenant) -> None:
    open_account(organization=acme.organization)
    assert submit_terms(organization=acme.organization) == SubmitTerms("prepaid", 10_000_000, {})


def test_an_account_not_opened_yet_is_opened_with_its_sign_up_credit(
    acme: Tenant, prices: list[PriceEntry]
) -> None:
    assert not BillingAccount.objects.filter(organization=acme.organization).exists()
    terms = submit_terms(organization=acme.organization)
    assert terms == SubmitTerms("prepaid", 10_000_000, hour_prices())
    assert LedgerEntry.objects.get(organization=acme.organization).kind == "promotion"
    assert submit_terms(organization=acme.organization) == terms  # now read, not opened


def test_a_balance_used_up_between_two_submissions_refuses_the_second(
    acme: Tenant, as_member: APIClient, live_controller: Any, prices: list[PriceEntry]
) -> None:
    job = {"script": "#!/bin/sh\ntrue\n", "gpus_per_node": 1, "hold": True, "time_limit_min": 10}
    assert as_member.post("/api/v1/jobs", job, format="json").status_code == 201
    post_entry(
        organization=acme.organization,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micro=-10_000_000,
        description="test: nothing left",
    )
    refused = as_member.post("/api/v1/jobs", job, format="json")
    assert refused.status_code == 402, refused.content
    assert "prepaid credit is used up" in refused.json()["detail"]


def test_a_price_raised_between_two_submissions_prices_the_second(
    acme: Tenant, as_member: APIClient, live_controller: Any, prices: list[PriceEntry]
) -> None:
    # 4 hours of one h100 at 2.50: 10.00, the whole balance; at 2.60 it is not covered.
    job = {"script": "#!/bin/sh\ntrue\n", "gpus_per_node": 1, "hold": True, "time_limit_min": 240}
    assert as_member.post("/api/v1/jobs", job, format="json").status_code == 201
    PriceEntry.objects.create(
        gpu_model="h100", qos_class=QosClass.ON_DEMAND,
        effective_from=datetime.now(UTC) - timedelta(seconds=1),
        gpu_hour_micro=H100_PRICE + 100_000,
    )  # fmt: skip
    refused = as_member.post("/api/v1/jobs", job, format="json")
    assert refused.status_code == 402, refused.content
    assert "10.40 USD" in refused.json()["detail"]
