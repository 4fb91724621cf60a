"""Billing in the Django admin. Records of money are read-only here: ledger entries,
invoices, credit notes, top-ups, Stripe events and meter reports are written by the
services only. A price may be added, to take effect in the future, and corrected or
withdrawn until then, never once in effect (the model and, on PostgreSQL, a trigger
refuse it too). What an operator does to money goes through the services, on pages of
their own (admin_operations.py): credit an organisation, issue a credit note."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from spurcloud.billing import admin_operations
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


class _ReadOnly(_Admin):
    """Shown, never added, changed or deleted here (the services write these)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PriceEntryForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = PriceEntry
        fields = [
            "gpu_model",
            "qos_class",
            "effective_from",
            "gpu_hour_micro",
            "cpu_hour_micro",
            "mem_gb_hour_micro",
        ]

    def clean_effective_from(self) -> Any:
        value = self.cleaned_data["effective_from"]
        if value is not None and value <= timezone.now():
            raise forms.ValidationError(
                "A new price takes effect in the future: past usage keeps the price it ran at."
            )
        return value


@admin.register(PriceEntry)
class PriceEntryAdmin(_Admin):
    form = PriceEntryForm
    list_display = (
        "gpu_model",
        "qos_class",
        "effective_from",
        "gpu_hour_micro",
        "cpu_hour_micro",
        "mem_gb_hour_micro",
    )
    list_filter = ("qos_class", "gpu_model")

    # In effect: history. Before: the operator may still correct or withdraw it.
    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.in_effect():
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is None or obj.in_effect():
            return False  # no bulk delete: the list mixes past and future entries
        return super().has_delete_permission(request, obj)


@admin.register(BillingAccount)
class BillingAccountAdmin(_Admin):
    list_display = ("organization", "mode", "balance_micro", "depleted_at", "stripe_customer_id")
    list_filter = ("mode",)
    # The balance is the ledger's sum: an operator changes it with a ledger entry (the
    # "Credit" page). The mode changes through its service.
    fields = (
        "organization",
        "mode",
        "balance_micro",
        "credit",
        "low_balance_micro",
        "warned_at",
        "depleted_at",
        "stripe_customer_id",
        "postpaid_since",
    )
    readonly_fields = (
        "organization",
        "balance_micro",
        "credit",
        "warned_at",
        "depleted_at",
        "stripe_customer_id",
        "postpaid_since",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # opened on first use

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # its ledger refers to it

    @admin.display(description="Credit")
    def credit(self, obj: BillingAccount) -> str:
        url = reverse("admin:billing_billingaccount_credit", args=[obj.pk])
        return format_html(
            '<a class="button" href="{}">Add credit, a refund or an adjustment</a>', url
        )

    def get_urls(self) -> list[URLPattern]:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            return admin_operations.credit_view(self, request, object_id)

        own = [
            path(
                "<path:object_id>/credit/",
                self.admin_site.admin_view(view),
                name="billing_billingaccount_credit",
            )
        ]
        return own + super().get_urls()

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if "mode" in form.changed_data:
            set_billing_mode(organization=obj.organization, mode=obj.mode)
        if "low_balance_micro" in form.changed_data:
            BillingAccount.objects.filter(pk=obj.pk).update(low_balance_micro=obj.low_balance_micro)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(_ReadOnly):
    # Append-only: operators add entries from an account's "Credit" page (the service).
    list_display = (
        "organization",
        "kind",
        "amount_micro",
        "balance_after_micro",
        "description",
        "created_by",
        "created_at",
    )
    list_filter = ("kind",)
    list_select_related = ("organization", "created_by")


@admin.register(TopUp)
class TopUpAdmin(_ReadOnly):
    list_display = ("organization", "amount_micro", "status", "created_at", "paid_at")
    list_filter = ("status",)
    list_select_related = ("organization",)


@admin.register(StripeEvent)
class StripeEventAdmin(_ReadOnly):
    list_display = ("event_id", "type", "received_at", "processed_at")
    list_filter = ("type",)


@admin.register(Invoice)
class InvoiceAdmin(_ReadOnly):
    list_display = ("number", "organization", "period_start", "total_micro")
    list_select_related = ("organization",)
    fields = (
        "number",
        "organization",
        "period_start",
        "period_end",
        "currency",
        "total_micro",
        "issued_at",
        "credit_note",
    )
    readonly_fields = fields

    @admin.display(description="Credit note")
    def credit_note(self, obj: Invoice) -> str:
        url = reverse("admin:billing_invoice_credit_note", args=[obj.pk])
        return format_html('<a class="button" href="{}">Issue a credit note</a>', url)

    def get_urls(self) -> list[URLPattern]:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            return admin_operations.credit_note_view(self, request, object_id)

        own = [
            path(
                "<path:object_id>/credit-note/",
                self.admin_site.admin_view(view),
                name="billing_invoice_credit_note",
            )
        ]
        return own + super().get_urls()


@admin.register(CreditNote)
class CreditNoteAdmin(_ReadOnly):
    # Issued from an invoice's "Credit note" page (invoices.issue_credit_note).
    list_display = ("number", "invoice", "amount_micro", "reason", "created_by", "created_at")
    list_select_related = ("invoice", "created_by")


@admin.register(MeterEventReport)
class MeterEventReportAdmin(_ReadOnly):
    # Written by meter_events.py only: the row is the "once" of a Stripe meter event.
    list_display = ("identifier", "organization", "value_micro", "timestamp", "reported_at")
    list_filter = ("reported_at",)


@admin.register(SpendAlert)
class SpendAlertAdmin(_Admin):
    list_display = ("organization", "kind", "threshold_micro", "created_at")
    list_filter = ("kind",)
