"""Design rules of billing, as tests: money is integers, and every money column says
its unit; records of money (ledger entries, invoices and their lines, credit notes,
prices in effect) are never edited or deleted: not from the admin, not through the
models, and on PostgreSQL not from anywhere (a trigger), but for a deliberate repair."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import DatabaseError, connection, models, transaction
from django.test import RequestFactory
from django.utils import timezone

from spurcloud.billing.errors import ImmutableRecord
from spurcloud.billing.invoices import issue_credit_note
from spurcloud.billing.ledger import open_account
from spurcloud.billing.models import CreditNote, Invoice, InvoiceLine, LedgerEntry, PriceEntry
from spurcloud.tenants.models import AuditEvent, Membership
from spurcloud.tenants.services import create_organization
from tests.billing.conftest import repair_money


def test_no_billing_model_keeps_a_float_or_a_money_column_without_its_unit() -> None:
    for model in apps.get_app_config("billing").get_models():
        for field in model._meta.concrete_fields:
            assert not isinstance(field, models.FloatField), f"{model.__name__}.{field.name}"
            if field.is_relation:
                continue
            if any(word in field.name for word in ("amount", "balance", "price", "_hour")):
                assert field.name.endswith("_micro") or field.name.endswith("_seconds"), (
                    f"{model.__name__}.{field.name}: money is in micro-units, and says so"
                )
                assert isinstance(field, models.BigIntegerField), f"{model.__name__}.{field.name}"


@pytest.mark.django_db
def test_the_ledger_is_append_only_in_the_admin() -> None:
    request = RequestFactory().get("/admin/")
    ledger_admin = admin.site._registry[LedgerEntry]
    assert not ledger_admin.has_add_permission(request)
    assert not ledger_admin.has_change_permission(request)
    assert not ledger_admin.has_delete_permission(request)


@pytest.fixture
def money(db: None) -> dict[str, Any]:
    from tests.spurcloud.conftest import make_user

    owner = make_user("olivia")
    organization = create_organization(name="Acme", owner=owner, slug="acme")
    open_account(organization=organization)  # the sign-up credit: one ledger entry
    start = datetime(2026, 3, 1, tzinfo=UTC)
    invoice = Invoice.objects.create(
        organization=organization, number="ACME-1-202603", period_start=start,
        period_end=datetime(2026, 4, 1, tzinfo=UTC), currency="usd", total_micro=3_000_000,
    )  # fmt: skip
    line = InvoiceLine.objects.create(
        invoice=invoice, gpu_model="h100", qos_class="on_demand", gpu_milli_seconds=1,
        amount_micro=3_000_000,
    )  # fmt: skip
    note = issue_credit_note(invoice=invoice, amount_micro=1_000_000, reason="outage", by=owner)
    price = PriceEntry.objects.create(
        gpu_model="h100", qos_class="on_demand", effective_from=start, gpu_hour_micro=2_500_000
    )
    return {
        "entry": LedgerEntry.objects.filter(organization=organization).first(),
        "invoice": invoice,
        "line": line,
        "note": note,
        "price": price,
        "owner": owner,
    }


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["entry", "invoice", "line", "note"])
def test_records_of_money_refuse_a_second_save_and_a_delete(
    money: dict[str, Any], name: str
) -> None:
    record = money[name]
    with pytest.raises(ImmutableRecord):
        record.save()
    with pytest.raises(ImmutableRecord):
        record.delete()
    assert type(record).objects.filter(pk=record.pk).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("entry", {"amount_micro": 1}),
        ("invoice", {"total_micro": 0}),
        ("line", {"amount_micro": 0}),
        ("note", {"amount_micro": 2}),
        ("price", {"gpu_hour_micro": 1}),
    ],
)
def test_postgresql_refuses_updates_and_deletes_of_money_from_anywhere(
    money: dict[str, Any], name: str, change: dict[str, Any]
) -> None:
    record = money[name]
    rows = type(record).objects.filter(pk=record.pk)
    # The queryset's update and delete skip the models' save and delete: the trigger
    # stops them, as it would stop a hand-written UPDATE.
    with pytest.raises(DatabaseError, match="refused|never edited"), transaction.atomic():
        rows.update(**change)
    table = type(record)._meta.db_table
    with (
        pytest.raises(DatabaseError, match="refused|never edited"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [record.pk])  # noqa: S608 - ours
    assert rows.exists()


@pytest.mark.django_db
def test_a_deliberate_repair_and_a_deleted_users_authorship_still_get_through(
    money: dict[str, Any],
) -> None:
    note = money["note"]
    repair_money(
        "UPDATE billing_creditnote SET reason = %s WHERE id = %s", ["outage (node07)", note.pk]
    )
    note.refresh_from_db()
    assert note.reason == "outage (node07)"
    with pytest.raises(DatabaseError, match="refused"), transaction.atomic():
        CreditNote.objects.filter(pk=note.pk).update(reason="switched off again")
    # Deleting a user clears created_by (ON DELETE SET NULL): allowed, nothing else is.
    assert LedgerEntry.objects.filter(created_by=money["owner"]).exists()
    Membership.objects.filter(user=money["owner"]).delete()
    AuditEvent.objects.filter(actor=money["owner"]).delete()
    money["owner"].delete()
    note.refresh_from_db()
    assert note.created_by is None
    assert not LedgerEntry.objects.filter(created_by__isnull=False).exists()


@pytest.mark.django_db
def test_a_future_price_may_be_corrected_or_withdrawn_but_not_moved_into_the_past(
    money: dict[str, Any],
) -> None:
    later = timezone.now() + timedelta(days=3)
    upcoming = PriceEntry.objects.create(
        gpu_model="h100", qos_class="on_demand", effective_from=later, gpu_hour_micro=3_000_000
    )
    upcoming.gpu_hour_micro = 2_900_000
    upcoming.save()
    PriceEntry.objects.filter(pk=upcoming.pk).update(gpu_hour_micro=2_800_000)
    with pytest.raises(DatabaseError, match="stays in the future"), transaction.atomic():
        PriceEntry.objects.filter(pk=upcoming.pk).update(effective_from=timezone.now())
    upcoming.effective_from = timezone.now() - timedelta(days=1)
    with pytest.raises(ImmutableRecord):
        upcoming.save()
    PriceEntry.objects.get(pk=upcoming.pk).delete()
    assert not PriceEntry.objects.filter(pk=upcoming.pk).exists()
    with pytest.raises(ImmutableRecord):
        money["price"].delete()
