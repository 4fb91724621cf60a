"""Operators' money work in the Django admin: credit, refunds, adjustments and credit
notes through the services (staff with the permission only, audited, once per form),
and every record of money read-only there."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from spurcloud.billing.invoices import issue_invoice
from spurcloud.billing.ledger import open_account
from spurcloud.billing.metering import meter_job_events
from spurcloud.billing.models import (
    BillingAccount,
    CreditNote,
    Invoice,
    LedgerEntry,
    PriceEntry,
    QosClass,
    StripeEvent,
    TopUp,
)
from tests.billing.conftest import T0, Tenant, job_event, make_user

pytestmark = pytest.mark.django_db

SIGNUP = 10_000_000


def _browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _operator(
    name: str = "root", *, permissions: tuple[str, ...] = (), superuser: bool = True
) -> Any:
    user = make_user(name, staff=True)
    user.is_superuser = superuser
    user.save()
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def _account(tenant: Tenant) -> BillingAccount:
    return open_account(organization=tenant.organization)


def _form(client: Client, url: str) -> dict[str, str]:
    """The form's hidden key, as the page gave it."""
    page = client.get(url)
    assert page.status_code == 200
    return {"key": page.context["form"].initial["key"]}


@pytest.fixture
def invoice(acme: Tenant, prices: Any) -> Invoice:
    open_account(organization=acme.organization)
    meter_job_events(
        events=[
            job_event(when=0, state="RUNNING", start=0),
            job_event(when=3661, state="COMPLETED", start=0, end=3661),
        ]
    )
    return issue_invoice(organization=acme.organization, month=T0)


def test_an_operator_adds_promotional_credit_through_the_service_audited_and_once(
    acme: Tenant,
) -> None:
    account = _account(acme)
    root = _operator()
    admin = _browser(root)
    url = f"/admin/billing/billingaccount/{account.pk}/credit/"
    assert url.encode() in admin.get(f"/admin/billing/billingaccount/{account.pk}/change/").content
    form = {**_form(admin, url), "kind": "promotion", "amount": "12.50", "description": "Welcome"}
    done = admin.post(url, form)
    assert done.status_code == 302
    entry = LedgerEntry.objects.get(kind="promotion", description="Welcome")
    assert (entry.amount_micro, entry.created_by) == (12_500_000, root)
    assert entry.balance_after_micro == SIGNUP + 12_500_000
    assert LogEntry.objects.filter(
        user=root, object_id=str(entry.pk), action_flag=ADDITION
    ).exists()
    # The same form posted again (a double click, a reload) changes nothing.
    admin.post(url, form)
    account.refresh_from_db()
    assert account.balance_micro == SIGNUP + 12_500_000
    assert LedgerEntry.objects.filter(kind="promotion", description="Welcome").count() == 1


def test_an_adjustment_may_take_credit_and_bad_amounts_change_nothing(acme: Tenant) -> None:
    account = _account(acme)
    admin = _browser(_operator())
    url = f"/admin/billing/billingaccount/{account.pk}/credit/"
    for kind, amount in (("refund", "-3"), ("promotion", "0"), ("adjustment", "0.0000001")):
        page = admin.post(
            url, {**_form(admin, url), "kind": kind, "amount": amount, "description": "x"}
        )
        assert page.status_code == 200 and page.context["form"].errors
    admin.post(
        url,
        {
            **_form(admin, url),
            "kind": "adjustment",
            "amount": "-2.25",
            "description": "Double-billed node07 outage",
        },
    )
    account.refresh_from_db()
    assert account.balance_micro == SIGNUP - 2_250_000
    assert LedgerEntry.objects.filter(organization=acme.organization).count() == 2


def test_an_operator_issues_a_credit_note_never_above_the_invoice(
    acme: Tenant, invoice: Invoice
) -> None:
    root = _operator()
    admin = _browser(root)
    url = f"/admin/billing/invoice/{invoice.pk}/credit-note/"
    assert url.encode() in admin.get(f"/admin/billing/invoice/{invoice.pk}/change/").content
    too_much = admin.post(url, {**_form(admin, url), "amount": "5.084723", "reason": "outage"})
    assert "left to credit" in str(too_much.context["form"].errors)
    form = {**_form(admin, url), "amount": "1.25", "reason": "outage on node07"}
    assert admin.post(url, form).status_code == 302
    assert admin.post(url, form).status_code == 302  # posted twice: one note
    note = CreditNote.objects.get(invoice=invoice)
    assert (note.amount_micro, note.created_by, note.reason) == (
        1_250_000,
        root,
        "outage on node07",
    )
    refund = LedgerEntry.objects.get(key=f"credit-note:{note.pk}")
    assert refund.amount_micro == 1_250_000 and refund.created_by == root
    assert LogEntry.objects.filter(user=root, object_id=str(note.pk)).exists()


def test_only_staff_with_the_permission_reach_the_operators_pages(
    acme: Tenant, invoice: Invoice
) -> None:
    account = BillingAccount.objects.get(organization=acme.organization)
    credit = f"/admin/billing/billingaccount/{account.pk}/credit/"
    note = f"/admin/billing/invoice/{invoice.pk}/credit-note/"
    body = {
        "key": "k1",
        "kind": "promotion",
        "amount": "100",
        "description": "free money",
        "reason": "free money",
    }
    # The organisation's owner is no staff: the admin sends them to its sign-in.
    for url in (credit, note):
        assert _browser(acme.owner).post(url, body).status_code == 302
    # Staff without the permission: refused.
    clerk = _browser(_operator("clerk", superuser=False))
    for url in (credit, note):
        assert clerk.get(url).status_code == 403
        assert clerk.post(url, body).status_code == 403
    assert not LedgerEntry.objects.filter(description="free money").exists()
    assert not CreditNote.objects.exists()
    # Staff with it: allowed (each page its own permission).
    accountant = _browser(
        _operator("accountant", permissions=("add_ledgerentry",), superuser=False)
    )
    assert accountant.post(credit, body).status_code == 302
    assert accountant.get(note).status_code == 403
    assert LedgerEntry.objects.filter(description="free money").count() == 1


def test_records_of_money_are_read_only_in_the_admin(acme: Tenant, invoice: Invoice) -> None:
    TopUp.objects.create(
        organization=acme.organization,
        amount_micro=5_000_000,
        session_id="cs_1",
        url="https://checkout.stripe.test/c/pay/cs_1",
    )
    StripeEvent.objects.create(event_id="evt_1", type="checkout.session.completed", payload={})
    admin = _browser(_operator())
    for model, obj in (
        ("ledgerentry", LedgerEntry.objects.first()),
        ("invoice", invoice),
        ("topup", TopUp.objects.get()),
        ("stripeevent", StripeEvent.objects.get()),
    ):
        assert obj is not None
        base = f"/admin/billing/{model}/"
        listing = admin.get(base)
        assert listing.status_code == 200, model
        assert b"delete_selected" not in listing.content, model
        assert admin.get(f"{base}add/").status_code == 403, model
        shown = admin.get(f"{base}{obj.pk}/change/")
        assert shown.status_code == 200 and b'name="_save"' not in shown.content, model
        assert admin.post(f"{base}{obj.pk}/change/", {"amount_micro": 1}).status_code == 403
        assert admin.post(f"{base}{obj.pk}/delete/", {"post": "yes"}).status_code == 403, model
    assert Invoice.objects.get(pk=invoice.pk).total_micro == 5_084_722


def test_a_price_is_added_for_the_future_and_never_edited_once_in_effect(prices: Any) -> None:
    admin = _browser(_operator())
    in_effect = prices[0]
    base = "/admin/billing/priceentry/"
    row = {
        "gpu_model": "h100",
        "qos_class": QosClass.ON_DEMAND,
        "gpu_hour_micro": 3_000_000,
        "cpu_hour_micro": 0,
        "mem_gb_hour_micro": 0,
    }
    past = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S").split(" ")
    page = admin.post(
        f"{base}add/", {**row, "effective_from_0": past[0], "effective_from_1": past[1]}
    )
    assert page.status_code == 200 and "in the future" in str(page.context["adminform"].form.errors)
    future = (timezone.now() + timedelta(days=7)).strftime("%Y-%m-%d %H:%M:%S").split(" ")
    added = admin.post(
        f"{base}add/", {**row, "effective_from_0": future[0], "effective_from_1": future[1]}
    )
    assert added.status_code == 302
    upcoming = PriceEntry.objects.get(gpu_hour_micro=3_000_000)
    # Not yet in effect: it may be corrected, or withdrawn.
    fixed = admin.post(
        f"{base}{upcoming.pk}/change/",
        {
            **row,
            "gpu_hour_micro": 2_900_000,
            "effective_from_0": future[0],
            "effective_from_1": future[1],
        },
    )
    assert fixed.status_code == 302
    upcoming.refresh_from_db()
    assert upcoming.gpu_hour_micro == 2_900_000
    # In effect: shown, never changed or deleted.
    shown = admin.get(f"{base}{in_effect.pk}/change/")
    assert shown.status_code == 200 and b'name="_save"' not in shown.content
    assert admin.post(f"{base}{in_effect.pk}/change/", {**row}).status_code == 403
    assert admin.post(f"{base}{in_effect.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin.post(f"{base}{upcoming.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not PriceEntry.objects.filter(pk=upcoming.pk).exists()
    in_effect.refresh_from_db()
    assert in_effect.gpu_hour_micro == 2_500_000
