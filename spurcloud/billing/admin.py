from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest

from spurcloud.billing.models import (
    BillingAccount,
    CreditNote,
    Invoice,
    LedgerEntry,
    MeterEventReport,
    PriceEntry,
    SpendAlert,
    StripeEvent,
    TopUp,
)
from spurcloud.billing.services import set_billing_mode

# Django's ModelAdmin is generic only in its stubs (subscripting it at run time fails).
if TYPE_CHECKING:
    _Admin = admin.ModelAdmin[Any]
else:
    _Admin = admin.ModelAdmin


@admin.register(PriceEntry)
class PriceEntryAdmin(_Admin):
    list_display = ("gpu_model", "qos_class", "effective_from", "gpu_hour_micro", "cpu_hour_micro")
    list_filter = ("qos_class", "gpu_model")


@admin.register(BillingAccount)
class BillingAccountAdmin(_Admin):
    list_display = ("organization", "mode", "balance_micro", "depleted_at", "stripe_customer_id")
    list_filter = ("mode",)
    # The balance is the ledger's sum: an operator changes it with a ledger entry
    # (services.credit_organization). The mode changes through its service.
    readonly_fields = (
        "organization",
        "balance_micro",
        "warned_at",
        "depleted_at",
        "stripe_customer_id",
        "postpaid_since",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # opened on first use

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if "mode" in form.changed_data:
            set_billing_mode(organization=obj.organization, mode=obj.mode)
        if "low_balance_micro" in form.changed_data:
            BillingAccount.objects.filter(pk=obj.pk).update(low_balance_micro=obj.low_balance_micro)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(_Admin):
    list_display = ("organization", "kind", "amount_micro", "balance_after_micro", "created_at")
    list_filter = ("kind",)

    # Append-only: entries are added by the services, never edited or deleted here.
    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(TopUp)
class TopUpAdmin(_Admin):
    list_display = ("organization", "amount_micro", "status", "created_at", "paid_at")


@admin.register(StripeEvent)
class StripeEventAdmin(_Admin):
    list_display = ("event_id", "type", "received_at", "processed_at")


@admin.register(Invoice)
class InvoiceAdmin(_Admin):
    list_display = ("number", "organization", "period_start", "total_micro")


@admin.register(CreditNote)
class CreditNoteAdmin(_Admin):
    list_display = ("number", "invoice", "amount_micro", "reason", "created_at")

    # Issued through invoices.issue_credit_note (it credits the ledger), never edited.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(MeterEventReport)
class MeterEventReportAdmin(_Admin):
    list_display = ("identifier", "organization", "value_micro", "timestamp", "reported_at")
    list_filter = ("reported_at",)

    # Written by meter_events.py only: the row is the "once" of a Stripe meter event.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(SpendAlert)
class SpendAlertAdmin(_Admin):
    list_display = ("organization", "kind", "threshold_micro", "created_at")
    list_filter = ("kind",)
