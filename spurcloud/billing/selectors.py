"""Billing's reads, and who may see what.

Roles (the membership's, `Membership.Role`): owners and billing members manage billing:
they read the ledger, usage and invoices and top up (a billing member runs no jobs).
Admins read them but do not pay. Members see the balance only (so they know why a
submission is refused) and the price book, like everyone signed in. Everything is
scoped to one organisation; an invoice of another is "not found", the same answer as a
missing one (`access_invoice`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from spurcloud.billing.models import (
    CreditNote,
    Invoice,
    LedgerEntry,
    PriceEntry,
    UsageRecord,
)
from spurcloud.tenants.models import Membership, Organization

if TYPE_CHECKING:
    from django.contrib.auth.models import User

BILLING = Membership.Role.BILLING.value


def billing_role(*, organization: Organization, user: User) -> str | None:
    """owner, admin, billing, member, or None for someone outside."""
    membership = Membership.objects.filter(organization=organization, user=user).first()
    return None if membership is None else str(membership.role)


def require_reader(*, organization: Organization, user: User) -> None:
    if billing_role(organization=organization, user=user) not in ("owner", "admin", BILLING):
        raise PermissionDenied(
            "Only the organisation's owners, admins and billing members see its billing."
        )


def require_payer(*, organization: Organization, user: User) -> None:
    if billing_role(organization=organization, user=user) not in ("owner", BILLING):
        raise PermissionDenied("Only the organisation's owners and billing members top it up.")


def require_member(*, organization: Organization, user: User) -> None:
    if billing_role(organization=organization, user=user) is None:
        raise PermissionDenied("You are not a member of this organisation.")


def ledger_of(*, organization: Organization) -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.filter(organization=organization).order_by("-id")


def usage_of(
    *, organization: Organization, since: datetime | None = None, until: datetime | None = None
) -> QuerySet[UsageRecord]:
    records = UsageRecord.objects.filter(organization=organization).select_related("run")
    if since is not None:
        records = records.filter(period_end__gt=since)
    if until is not None:
        records = records.filter(period_start__lt=until)
    return records.order_by("-period_start", "-id")


def price_book() -> QuerySet[PriceEntry]:
    return PriceEntry.objects.order_by("gpu_model", "qos_class", "-effective_from")


def invoices_of(*, organization: Organization) -> QuerySet[Invoice]:
    return Invoice.objects.filter(organization=organization).order_by("-period_start")


def access_invoice(*, organization: Organization, invoice_id: int) -> Invoice:
    invoice = (
        Invoice.objects.filter(organization=organization, pk=invoice_id)
        .prefetch_related("lines", "credit_notes")
        .first()
    )
    if invoice is None:
        raise Http404(f"Invoice {invoice_id} not found.")
    return invoice


def access_credit_note(*, organization: Organization, invoice_id: int, note_id: int) -> CreditNote:
    note = (
        CreditNote.objects.filter(
            invoice__organization=organization, invoice_id=invoice_id, pk=note_id
        )
        .select_related("invoice__organization")
        .first()
    )
    if note is None:
        raise Http404(f"Credit note {note_id} not found.")
    return note
