"""The billing API, as owner, admin, billing member, member and outsider."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from spurcloud.billing.invoices import issue_invoice
from spurcloud.billing.ledger import open_account
from spurcloud.billing.metering import meter_job_events
from spurcloud.billing.models import Invoice
from tests.billing.conftest import T0, Tenant, api_client, job_event

pytestmark = pytest.mark.django_db


@pytest.fixture
def used(acme: Tenant, globex: Tenant, prices: Any) -> Invoice:
    """acme ran a job for an hour in March 2026 (invoiced); globex ran one too."""
    open_account(organization=acme.organization)
    open_account(organization=globex.organization)
    for tenant, job_id in (("acme", 7), ("globex", 8)):
        meter_job_events(
            events=[
                job_event(job_id, when=0, state="RUNNING", start=0, tenant=tenant),
                job_event(job_id, when=3600, state="COMPLETED", start=0, end=3600, tenant=tenant),
            ]
        )
    issue_invoice(organization=globex.organization, month=T0)
    return issue_invoice(organization=acme.organization, month=T0)


def _roles(
    acme: Tenant, admin_user: Any, billing_user: Any, as_outsider: APIClient
) -> dict[str, APIClient]:
    return {
        "owner": api_client(acme.owner, acme.organization),
        "admin": api_client(admin_user, acme.organization),
        "billing": api_client(billing_user, acme.organization),
        "member": api_client(acme.member, acme.organization),
        "outsider": as_outsider,
    }


def test_every_member_sees_the_balance_of_their_own_organisation_only(
    used: Invoice, acme: Tenant, admin_user: Any, billing_user: Any, as_outsider: APIClient
) -> None:
    for role, client in _roles(acme, admin_user, billing_user, as_outsider).items():
        body = client.get("/api/v1/billing/balance").json()
        expected = 10_000_000 - 5_000_000
        assert body["balance_micro"] == expected, role
        assert body["balance"] == "5.000000" and body["currency"] == "usd"
        assert body["credit_used_up"] is False


@pytest.mark.parametrize("path", ["ledger", "usage", "invoices"])
def test_only_owners_admins_and_billing_contacts_read_the_ledger_usage_and_invoices(
    used: Invoice,
    acme: Tenant,
    admin_user: Any,
    billing_user: Any,
    as_outsider: APIClient,
    path: str,
) -> None:
    answers = {
        role: client.get(f"/api/v1/billing/{path}")
        for role, client in _roles(acme, admin_user, billing_user, as_outsider).items()
    }
    for role in ("owner", "admin", "billing"):
        assert answers[role].status_code == 200, (role, answers[role].json())
    assert answers["member"].status_code == 403
    # The outsider reads its own organisation's, never acme's.
    outsider = answers["outsider"].json()["results"]
    acme_rows = answers["owner"].json()["results"]
    assert {r["id"] for r in outsider}.isdisjoint({r["id"] for r in acme_rows})


def test_the_ledger_lists_entries_newest_first_in_pages(
    used: Invoice, acme: Tenant, as_owner: APIClient
) -> None:
    first = as_owner.get("/api/v1/billing/ledger?limit=1").json()
    assert [e["kind"] for e in first["results"]] == ["usage"]
    assert first["results"][0]["amount_micro"] == -5_000_000
    second = as_owner.get(first["next"]).json()
    assert [e["kind"] for e in second["results"]] == ["promotion"]
    assert second["next"] is None


def test_usage_lists_records_per_job_and_period(used: Invoice, as_owner: APIClient) -> None:
    rows = as_owner.get("/api/v1/billing/usage").json()["results"]
    assert [(r["job_id"], r["attempt"], r["gpu_model"], r["amount_micro"]) for r in rows] == [
        (7, 1, "h100", 5_000_000)
    ]
    assert rows[0]["gpu_milli_seconds"] == 2000 * 3600
    since = as_owner.get("/api/v1/billing/usage", {"since": "2027-01-01T00:00:00Z"}).json()
    assert since["results"] == []


@pytest.mark.parametrize(
    "query", ["limit=0", "limit=100000", "before=-1", "since=yesterday", "colour=blue"]
)
def test_bad_queries_are_refused_with_a_clear_error(as_owner: APIClient, query: str) -> None:
    response = as_owner.get(f"/api/v1/billing/usage?{query}")
    assert response.status_code == 400
    assert response.json()["detail"]


def test_the_price_book_is_readable_by_every_member(
    prices: Any, as_member: APIClient, as_outsider: APIClient
) -> None:
    for client in (as_member, as_outsider):
        rows = client.get("/api/v1/billing/prices").json()
        assert {(r["gpu_model"], r["qos_class"], r["gpu_hour_micro"]) for r in rows} == {
            ("h100", "on_demand", 2_500_000),
            ("h100", "spot", 1_000_000),
            ("", "on_demand", 1_800_000),
        }


def test_an_invoice_has_lines_that_add_up_to_its_total(
    used: Invoice, acme: Tenant, as_owner: APIClient
) -> None:
    body = as_owner.get(f"/api/v1/billing/invoices/{used.pk}").json()
    assert body["period_start"].startswith("2026-03-01")
    assert [(line["gpu_model"], line["qos_class"]) for line in body["lines"]] == [
        ("h100", "on_demand")
    ]
    assert sum(line["amount_micro"] for line in body["lines"]) == body["total_micro"] == 5_000_000
    html = as_owner.get(f"/api/v1/billing/invoices/{used.pk}/html")
    assert html.status_code == 200 and html["Content-Type"].startswith("text/html")
    assert "5.00 USD" in html.content.decode() and used.number in html.content.decode()


def test_another_organisations_invoice_is_not_found(
    used: Invoice, as_outsider: APIClient, globex: Tenant
) -> None:
    assert as_outsider.get(f"/api/v1/billing/invoices/{used.pk}").status_code == 404
    assert as_outsider.get(f"/api/v1/billing/invoices/{used.pk}/html").status_code == 404
    assert as_outsider.get("/api/v1/billing/invoices/999999999999").status_code == 404


def test_issuing_an_invoice_twice_gives_the_same_one(used: Invoice, acme: Tenant) -> None:
    again = issue_invoice(organization=acme.organization, month=datetime(2026, 3, 31, tzinfo=UTC))
    assert again.pk == used.pk


def test_the_usage_list_costs_no_more_queries_for_many_records_than_for_one(
    used: Invoice, acme: Tenant, as_owner: APIClient
) -> None:
    with CaptureQueriesContext(connection) as few:
        as_owner.get("/api/v1/billing/usage")
    for job_id in range(100, 110):
        meter_job_events(
            events=[
                job_event(job_id, when=0, state="RUNNING", start=0),
                job_event(job_id, when=60, state="COMPLETED", start=0, end=60),
            ]
        )
    with CaptureQueriesContext(connection) as many:
        rows = as_owner.get("/api/v1/billing/usage").json()["results"]
    assert len(rows) == 11
    assert len(many.captured_queries) <= len(few.captured_queries)


def test_a_credit_note_credits_the_balance_and_never_exceeds_the_invoice(
    used: Invoice, acme: Tenant, as_owner: APIClient
) -> None:
    from spurcloud.billing.errors import BillingRefused
    from spurcloud.billing.invoices import issue_credit_note

    before = as_owner.get("/api/v1/billing/balance").json()["balance_micro"]
    note = issue_credit_note(invoice=used, amount_micro=1_000_000, reason="outage on node07")
    assert note.number == f"{used.number}-CN1"
    after = as_owner.get("/api/v1/billing/balance").json()["balance_micro"]
    assert after == before + 1_000_000
    with pytest.raises(BillingRefused, match="at most 4.00 USD"):
        issue_credit_note(invoice=used, amount_micro=4_000_001, reason="too much")
    issue_credit_note(invoice=used, amount_micro=4_000_000, reason="the rest")
    body = as_owner.get(f"/api/v1/billing/invoices/{used.pk}").json()
    assert [n["amount_micro"] for n in body["credit_notes"]] == [1_000_000, 4_000_000]
    html = as_owner.get(f"/api/v1/billing/invoices/{used.pk}/html").content.decode()
    assert "outage on node07" in html
