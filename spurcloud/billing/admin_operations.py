"""What an operator does to an organisation's money from the admin: credit it
(promotional credit, a refund, an adjustment of either sign) and issue a credit note
against an invoice. Each is a form on its own admin page that calls the service
(`services.credit_organization`, `invoices.issue_credit_note`), so the admin writes
nothing the services do not; each needs the staff flag (the admin's own gate) and the
permission to add what it makes (`billing.add_ledgerentry`, `billing.add_creditnote`).

Audited twice: the record itself says who made it and why (the entry's `created_by` and
description, the note's `created_by` and reason), and the admin's history has an
addition by the operator (a `LogEntry`). A hidden key per form makes a form posted twice
do it once."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse

from spurcloud.billing.errors import BillingRefused
from spurcloud.billing.invoices import issue_credit_note
from spurcloud.billing.models import BillingAccount, Invoice, LedgerEntry
from spurcloud.billing.money import format_amount, from_decimal
from spurcloud.billing.services import credit_organization

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

MAX_AMOUNT = Decimal(10) ** 9  # currency units; far above any real credit


class _OperatorForm(forms.Form):
    key = forms.CharField(widget=forms.HiddenInput, max_length=64)
    amount = forms.DecimalField(max_digits=16, decimal_places=6, max_value=MAX_AMOUNT)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["amount"].label = f"Amount ({settings.BILLING_CURRENCY.upper()})"
        if not self.is_bound:
            self.initial.setdefault("key", uuid.uuid4().hex)

    def amount_micro(self) -> int:
        return from_decimal(self.cleaned_data["amount"])


class CreditForm(_OperatorForm):
    KINDS = [
        (LedgerEntry.Kind.PROMOTION.value, "Promotional credit (positive)"),
        (LedgerEntry.Kind.REFUND.value, "Refund (positive)"),
        (LedgerEntry.Kind.ADJUSTMENT.value, "Adjustment (positive adds, negative takes)"),
    ]
    kind = forms.ChoiceField(choices=KINDS)
    description = forms.CharField(
        max_length=200, help_text="Why: the organisation sees it in its ledger."
    )
    field_order = ["kind", "amount", "description", "key"]


class CreditNoteForm(_OperatorForm):
    reason = forms.CharField(
        max_length=200, help_text="Why: printed on the note the organisation receives."
    )
    field_order = ["amount", "reason", "key"]


def _require(request: HttpRequest, permission: str) -> None:
    if not (request.user.is_active and request.user.is_staff):
        raise PermissionDenied
    if not request.user.has_perm(permission):
        raise PermissionDenied(f"This needs the permission {permission}.")


def _page(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    *,
    form: forms.Form,
    original: Any,
    title: str,
    summary: str,
) -> TemplateResponse:
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "original": original,
        "title": title,
        "summary": summary,
        "form": form,
    }
    return TemplateResponse(request, "admin/billing/operator_form.html", context)


def credit_view(model_admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    """Credit or adjust one organisation's balance (a ledger entry)."""
    _require(request, "billing.add_ledgerentry")
    account = get_object_or_404(BillingAccount.objects.select_related("organization"), pk=object_id)
    organization = account.organization
    form = CreditForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            entry = credit_organization(
                organization=organization,
                kind=form.cleaned_data["kind"],
                amount_micro=form.amount_micro(),
                description=form.cleaned_data["description"],
                by=request.user,  # type: ignore[arg-type] # a staff member, signed in
                key=f"operator:{form.cleaned_data['key']}",
            )
        except (BillingRefused, ValueError) as exc:
            form.add_error("amount", getattr(exc, "message", str(exc)))
        else:
            if entry is None:
                messages.info(request, "That form was already posted: nothing changed.")
            else:
                model_admin.log_addition(
                    request, entry, f"{entry.get_kind_display()} {entry.amount_micro} micro-units"
                )
                messages.success(
                    request,
                    f"{entry.get_kind_display()} of {_money(entry.amount_micro)} recorded; "
                    f"the balance is {_money(entry.balance_after_micro)}.",
                )
            return HttpResponseRedirect(
                reverse("admin:billing_billingaccount_change", args=[account.pk])
            )
    return _page(
        model_admin,
        request,
        form=form,
        original=account,
        title=f"Credit {organization.name}",
        summary=f"Balance now {_money(account.balance_micro)} ({account.get_mode_display()}).",
    )


def credit_note_view(
    model_admin: ModelAdmin[Any], request: HttpRequest, object_id: str
) -> HttpResponse:
    """Issue a credit note against one invoice (it refunds the organisation)."""
    _require(request, "billing.add_creditnote")
    invoice = get_object_or_404(Invoice.objects.select_related("organization"), pk=object_id)
    form = CreditNoteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            note = issue_credit_note(
                invoice=invoice,
                amount_micro=form.amount_micro(),
                reason=form.cleaned_data["reason"],
                by=request.user,  # type: ignore[arg-type] # a staff member, signed in
                key=f"operator:{form.cleaned_data['key']}",
            )
        except (BillingRefused, ValueError) as exc:
            form.add_error("amount", getattr(exc, "message", str(exc)))
        else:
            model_admin.log_addition(request, note, f"credit note {note.number}")
            messages.success(
                request, f"Credit note {note.number} of {_money(note.amount_micro)} issued."
            )
            return HttpResponseRedirect(reverse("admin:billing_invoice_change", args=[invoice.pk]))
    credited = sum(n.amount_micro for n in invoice.credit_notes.all())
    return _page(
        model_admin,
        request,
        form=form,
        original=invoice,
        title=f"Credit note for invoice {invoice.number}",
        summary=(
            f"Total {_money(invoice.total_micro)}; credited so far {_money(credited)}; "
            f"at most {_money(invoice.total_micro - credited)} left to credit."
        ),
    )


def _money(micro: int) -> str:
    return format_amount(micro, settings.BILLING_CURRENCY)
