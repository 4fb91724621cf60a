"""Monthly invoices: an organisation's usage records of one calendar month (UTC), one
line per GPU model and QoS class. The lines are sums of the records' integer amounts,
and the total is the sum of the lines, so they add up exactly. Issued once per month
(a unique key); printable as HTML (`invoice_html`) and PDF (`invoice_pdf.py`), both
from `invoice_document`."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import Sum
from django.template.loader import render_to_string
from django.utils import timezone

from spurcloud.billing.errors import BillingRefused
from spurcloud.billing.ledger import post_entry
from spurcloud.billing.models import (
    CreditNote,
    Invoice,
    InvoiceLine,
    LedgerEntry,
    MeteredRun,
    UsageRecord,
)
from spurcloud.billing.money import format_amount
from spurcloud.billing.pricing import month_start, next_month
from spurcloud.tenants.models import Organization

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)


def invoice_number(organization: Organization, start: datetime) -> str:
    """Unique by construction: (organisation id, month) is the invoice's own key. The
    slug's first characters are for a reader only: two slugs may share them."""
    return f"{organization.slug.upper()[:12]}-{organization.pk}-{start:%Y%m}"


def issue_invoice(*, organization: Organization, month: datetime) -> Invoice:
    """The invoice of the month that holds `month` (issued now if it was not yet)."""
    start = month_start(month)
    end = next_month(start)
    existing = Invoice.objects.filter(organization=organization, period_start=start).first()
    if existing is not None:
        return existing
    groups = (
        UsageRecord.objects.filter(
            organization=organization, period_start__gte=start, period_start__lt=end
        )
        .values("gpu_model", "qos_class")
        .annotate(amount=Sum("amount_micro"), gpu_ms=Sum("gpu_milli_seconds"))
        .order_by("gpu_model", "qos_class")
    )
    lines = [
        InvoiceLine(
            gpu_model=g["gpu_model"],
            qos_class=g["qos_class"],
            gpu_milli_seconds=int(g["gpu_ms"] or 0),
            amount_micro=int(g["amount"] or 0),
        )
        for g in groups
    ]
    try:
        with transaction.atomic():
            invoice = Invoice.objects.create(
                organization=organization,
                number=invoice_number(organization, start),
                period_start=start,
                period_end=end,
                currency=settings.BILLING_CURRENCY,
                total_micro=sum(line.amount_micro for line in lines),
            )
            for line in lines:
                line.invoice = invoice
            InvoiceLine.objects.bulk_create(lines)
    except IntegrityError:
        # Another worker issued it meanwhile (the number cannot clash: it holds the
        # organisation's id); anything else is a real error and propagates.
        raced = Invoice.objects.filter(organization=organization, period_start=start).first()
        if raced is None:
            raise
        return raced
    return invoice


def issue_last_months_invoices(*, now: datetime | None = None) -> list[Invoice]:
    """Last month's invoice of every organisation that used something in it, once the
    month's usage is final: `BILLING_INVOICE_SETTLE_S` after the month ended (late end
    events and the daily reconciliation correct usage until then), and only for an
    organisation none of whose running jobs is still metered short of the month's end
    (the tick has not reached it: the beat was late or stopped). One organisation's
    failure is logged and leaves the others invoiced; the next hourly run retries it."""
    now = now or timezone.now()
    this_month = month_start(now)
    if now < this_month + timedelta(seconds=int(settings.BILLING_INVOICE_SETTLE_S)):
        return []
    last_month = month_start(this_month - timedelta(days=1))
    org_ids = set(
        UsageRecord.objects.filter(period_start__gte=last_month, period_start__lt=this_month)
        .values_list("organization_id", flat=True)
        .distinct()
    )
    org_ids -= set(
        Invoice.objects.filter(period_start=last_month).values_list("organization_id", flat=True)
    )
    unsettled = set(
        MeteredRun.objects.filter(
            organization_id__in=org_ids, ended_at__isnull=True, metered_until__lt=this_month
        ).values_list("organization_id", flat=True)
    )
    for org_id in sorted(unsettled):
        log.warning("organisation %s: running jobs not metered to the month's end yet", org_id)
    issued = []
    for organization in Organization.objects.filter(pk__in=org_ids - unsettled).order_by("pk"):
        try:
            issued.append(issue_invoice(organization=organization, month=last_month))
        except (OperationalError, InterfaceError):
            raise  # the database itself: the task retries the whole run
        except Exception:
            log.exception("organisation %s: %s's invoice failed", organization.slug, last_month)
    return issued


def issue_credit_note(
    *,
    invoice: Invoice,
    amount_micro: int,
    reason: str,
    by: User | None = None,
    key: str | None = None,
) -> CreditNote:
    """An operator's credit note against `invoice`: at most what its earlier notes left
    of its total; credits the organisation (a refund entry keyed by the note). A `key`
    used before returns that request's note and changes nothing."""
    if amount_micro <= 0:
        raise BillingRefused("a credit note's amount must be positive", field="amount")
    if not reason.strip():
        raise BillingRefused("a credit note needs a reason", field="reason")
    with transaction.atomic():
        # The invoice row serialises notes against it (then the account, in post_entry).
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        # Checked under the lock: a second request with the key waits for the first.
        earlier = CreditNote.objects.filter(key=key).first() if key is not None else None
        if earlier is not None:
            return earlier
        credited = locked.credit_notes.aggregate(total=Sum("amount_micro"))["total"] or 0
        if credited + amount_micro > locked.total_micro:
            left = format_amount(locked.total_micro - credited, locked.currency)
            raise BillingRefused(
                f"at most {left} is left to credit on this invoice", field="amount"
            )
        count = locked.credit_notes.count()
        note = CreditNote.objects.create(
            invoice=locked,
            number=f"{locked.number}-CN{count + 1}",
            amount_micro=amount_micro,
            reason=reason.strip()[:200],
            created_by=by,
            key=key,
        )
        post_entry(
            organization=locked.organization,
            kind=LedgerEntry.Kind.REFUND,
            amount_micro=amount_micro,
            key=f"credit-note:{note.pk}",
            description=f"Credit note {note.number}: {note.reason}",
            user=by,
        )
    return note


def invoice_document(invoice: Invoice) -> dict[str, Any]:
    """What a printed invoice shows, as text: the HTML page and the PDF both print this,
    so they cannot disagree (the amounts are the stored integers, formatted exactly)."""
    currency = invoice.currency
    return {
        "invoice": invoice,
        "lines": [
            {
                "gpu_model": line.gpu_model or "any",
                "qos": line.get_qos_class_display(),
                "gpu_hours": f"{Decimal(line.gpu_milli_seconds) / 3_600_000:.3f}",
                "amount": format_amount(line.amount_micro, currency),
            }
            for line in invoice.lines.all()
        ],
        "total": format_amount(invoice.total_micro, currency),
        "credit_notes": [
            {
                "number": note.number,
                "reason": note.reason,
                "amount": format_amount(note.amount_micro, currency),
                "created_at": note.created_at,
            }
            for note in invoice.credit_notes.all()
        ],
    }


def invoice_html(invoice: Invoice) -> str:
    return render_to_string("billing/invoice.html", invoice_document(invoice))
