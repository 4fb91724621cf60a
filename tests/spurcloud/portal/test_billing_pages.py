"""The portal's billing page (balance, warnings, top-up, usage chart, invoices, ledger)
and the printable invoice, seen by each role, an outsider and nobody signed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from spurcloud.billing.invoices import issue_invoice
from spurcloud.billing.ledger import open_account, post_entry
from spurcloud.billing.models import LedgerEntry, MeteredRun, QosClass, TopUp, UsageRecord
from spurcloud.tenants.models import Organization
from tests.fixtures.stripe_fake import FakeStripe, stripe_fake  # noqa: F401 - a fixture
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import EVERYONE, ROLES, browser

READERS = ["owner", "admin", "billing"]
PAYERS = ["owner", "billing"]


def usage(organization: Organization, start: datetime, *, micro: int, model: str = "h100") -> None:
    """One minute of one GPU, charged `micro`."""
    run, _ = MeteredRun.objects.get_or_create(
        cluster="c",
        job_id=organization.pk * 1000 + int(start.timestamp()) // 86400 % 1000,
        attempt=0,
        defaults={
            "organization": organization,
            "gpu_model": model,
            "qos_class": QosClass.ON_DEMAND,
            "gpu_milli": 1000,
            "started_at": start,
            "metered_until": start,
        },
    )
    UsageRecord.objects.create(
        run=run,
        organization=organization,
        period_start=start,
        period_end=start + timedelta(minutes=1),
        gpu_model=model,
        qos_class=QosClass.ON_DEMAND,
        gpu_milli_seconds=60_000,
        amount_micro=micro,
    )


@pytest.mark.parametrize("who", EVERYONE)
def test_every_member_sees_their_organisations_balance(who: str, people: dict[str, Any]) -> None:
    response = browser(people[who]).get("/billing/")
    assert response.status_code == 200
    page = response.content.decode()
    name = "Globex" if who == "outsider" else "Acme"
    assert f"Billing of {name}" in page and "Balance: <strong>10.00 USD</strong>" in page


def test_nobody_signed_in_is_sent_to_sign_in(db: None) -> None:
    for path in ("/billing/", "/billing/invoices/1"):
        response = browser(None).get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    response = browser(None).post("/billing/topup", {"amount": "10"})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("who", ROLES)
def test_readers_see_usage_invoices_and_ledger_members_the_balance_only(
    who: str, acme: Tenant, people: dict[str, Any]
) -> None:
    now = timezone.now()
    usage(acme.organization, now - timedelta(minutes=5), micro=1_250_000)
    usage(acme.organization, now - timedelta(days=1), micro=2_000_001, model="mi300x")
    page = browser(people[who]).get("/billing/").content.decode()
    reader = who in READERS
    assert ('<svg class="chart"' in page) == reader
    assert ("Ledger" in page and "Sign-up credit" in page) == reader
    assert ("Continue to payment" in page) == (who in PAYERS)
    if reader:
        assert "<td>h100</td><td>0.02</td><td>1.25 USD</td>" in page
        assert "<td>mi300x</td><td>0.02</td><td>2.000001 USD</td>" in page
        assert 'role="img"' in page and "<title>Spend per day by GPU model" in page


def test_a_low_balance_warns_and_a_used_up_one_says_jobs_are_refused(
    acme: Tenant, people: dict[str, Any], settings: Any
) -> None:
    settings.BILLING_LOW_BALANCE_MICRO = 20_000_000
    page = browser(people["member"]).get("/billing/").content.decode()
    assert "Low balance: below 20.00 USD" in page and "Ask an owner" in page
    post_entry(
        organization=acme.organization,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micro=-10_000_000,
        key="zero",
        description="x",
    )
    page = browser(people["owner"]).get("/billing/").content.decode()
    assert "prepaid credit is used up" in page and "Top up below" in page


@pytest.mark.parametrize("who", EVERYONE)
def test_owners_and_billing_members_top_up_through_checkout(
    who: str,
    acme: Tenant,
    people: dict[str, Any],
    stripe_fake: FakeStripe,  # noqa: F811
) -> None:
    response = browser(people[who]).post("/billing/topup", {"amount": "25.50"})
    if who in ("admin", "member"):
        assert response.status_code == 403 and TopUp.objects.count() == 0
        return
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    topup = TopUp.objects.get()
    assert topup.amount_micro == 25_500_000
    assert f'href="{topup.url}"' in response.content.decode()
    session = stripe_fake.sessions[topup.session_id]
    assert session["success_url"].endswith("?topup=done")


@pytest.mark.parametrize("who", EVERYONE)
def test_owners_and_billing_members_reach_stripes_customer_portal_from_the_page(
    who: str,
    acme: Tenant,
    people: dict[str, Any],
    stripe_fake: FakeStripe,  # noqa: F811
) -> None:
    client = browser(people[who])
    page = client.get("/billing/").content.decode()
    payer = who in ("owner", "billing", "outsider")  # the outsider owns globex: its own
    assert ('action="/billing/stripe-portal"' in page) is payer
    response = client.post("/billing/stripe-portal")
    if not payer:
        assert response.status_code == 403 and not stripe_fake.customers
        return
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    assert 'href="https://billing.stripe.test/p/session/' in response.content.decode()
    [customer] = stripe_fake.customers.values()
    assert customer["metadata"]["slug"] == ("globex" if who == "outsider" else "acme")
    assert client.get("/billing/stripe-portal").status_code == 405


def test_the_customer_portal_without_stripe_says_so(people: dict[str, Any]) -> None:
    response = browser(people["owner"]).post("/billing/stripe-portal", follow=True)
    assert "Payments are not configured" in response.content.decode()


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("abc", "Enter an amount"),
        ("1e999", "amount must be between"),
        ("Infinity", "Enter an amount"),
        ("NaN", "Enter an amount"),
        ("-5", "amount must be between"),
        ("4.99", "amount must be between 5.00 USD and"),
        ("10000000", "amount must be between"),
        ("10.001", "whole number of cents"),
    ],
)
def test_a_bad_amount_is_refused_with_a_message(
    amount: str,
    message: str,
    people: dict[str, Any],
    stripe_fake: FakeStripe,  # noqa: F811
) -> None:
    client = browser(people["owner"])
    response = client.post("/billing/topup", {"amount": amount}, follow=True)
    assert message in response.content.decode() and TopUp.objects.count() == 0


def test_the_return_page_says_what_happened(people: dict[str, Any]) -> None:
    client = browser(people["owner"])
    assert "payment is being confirmed" in client.get("/billing/?topup=done").content.decode()
    assert "nothing was charged" in client.get("/billing/?topup=cancelled").content.decode()
    assert "nothing was charged" not in client.get("/billing/?topup=<x>").content.decode()


@pytest.mark.parametrize("who", EVERYONE)
def test_the_printable_invoice_for_readers_of_its_organisation(
    who: str, acme: Tenant, people: dict[str, Any]
) -> None:
    usage(acme.organization, datetime(2026, 3, 10, 12, tzinfo=UTC), micro=3_000_000)
    invoice = issue_invoice(organization=acme.organization, month=datetime(2026, 3, 1, tzinfo=UTC))
    response = browser(people[who]).get(f"/billing/invoices/{invoice.pk}")
    expected = {"owner": 200, "admin": 200, "billing": 200, "member": 403, "outsider": 404}
    assert response.status_code == expected[who]
    if response.status_code == 200:
        page = response.content.decode()
        assert f"Invoice {invoice.number}" in page and "3.00 USD" in page
        assert "<style" not in page  # the policy allows no inline style
    if who in READERS:
        listing = browser(people[who]).get("/billing/").content.decode()
        assert f'href="/billing/invoices/{invoice.pk}"' in listing


def test_an_unknown_or_huge_invoice_id_is_not_found(people: dict[str, Any]) -> None:
    client = browser(people["owner"])
    assert client.get("/billing/invoices/999999").status_code == 404
    assert client.get("/billing/invoices/9999999999999999999").status_code == 404


def test_the_balance_is_opened_on_first_sight(acme: Tenant, people: dict[str, Any]) -> None:
    assert open_account(organization=acme.organization).balance_micro == 10_000_000
