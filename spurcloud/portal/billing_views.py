"""The portal's billing pages: the organisation's balance, top-up, usage chart, invoices
and ledger. Who sees what is billing's (`spurcloud.billing.selectors`): every member sees
the balance and prices; owners, admins and billing members the usage, invoices and
ledger; owners and billing members top up."""

from __future__ import annotations

from datetime import UTC, timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from spurcloud.billing import reports, selectors, spend_alerts, stripe_payments
from spurcloud.billing.charts import stacked_bars
from spurcloud.billing.errors import BillingRefused, PaymentProviderError
from spurcloud.billing.invoices import invoice_html
from spurcloud.billing.ledger import low_balance_micro, open_account
from spurcloud.billing.models import BillingAccount, SpendAlert
from spurcloud.billing.money import format_amount, format_compact, from_decimal, to_decimal
from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.tenants.models import Membership

USAGE_DAYS = 30
LEDGER_ROWS = 50
INVOICE_ROWS = 24
TOPUP_RESULTS = {
    "done": "Thank you: your payment is being confirmed; the credit appears here once "
    "Stripe confirms it (usually within a minute).",
    "cancelled": "The top-up was cancelled: nothing was charged.",
}


def _money(micro: int) -> str:
    return format_amount(micro, settings.BILLING_CURRENCY)


@with_membership
def billing(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    organization = membership.organization
    role = str(membership.role)
    account = open_account(organization=organization)
    low = low_balance_micro(account)
    prepaid = account.mode == BillingAccount.Mode.PREPAID
    context: dict[str, object] = {
        "account": account,
        "balance": _money(account.balance_micro),
        "low_balance": _money(low),
        "is_low": prepaid and 0 < account.balance_micro < low,
        "used_up": prepaid and account.balance_micro <= 0,
        "can_read": role in ("owner", "admin", selectors.BILLING),
        "can_pay": role in ("owner", selectors.BILLING),
        "topup_min": _money(int(settings.BILLING_TOPUP_MIN_MICRO)),
        "topup_max": _money(int(settings.BILLING_TOPUP_MAX_MICRO)),
        "topup_min_value": to_decimal(int(settings.BILLING_TOPUP_MIN_MICRO)),
        "topup_max_value": to_decimal(int(settings.BILLING_TOPUP_MAX_MICRO)),
        "topup_result": TOPUP_RESULTS.get(request.GET.get("topup", "")),
        "currency": settings.BILLING_CURRENCY.upper(),
    }
    if context["can_read"]:
        today = timezone.now().astimezone(UTC).date()
        since = today - timedelta(days=USAGE_DAYS - 1)
        rows = reports.daily(since=since, by=["gpu_model"], organization=organization)
        bars = reports.bars_by_day(rows, since=since, until=today, key="gpu_model", value="amount")
        context["usage_chart"] = stacked_bars(
            bars,
            title=f"Spend per day by GPU model, last {USAGE_DAYS} days",
            fmt=_money,
            axis_fmt=lambda micro: format_compact(micro, settings.BILLING_CURRENCY),
        )
        context["usage_rows"] = [
            {"model": model or "other", "amount": _money(amount), "gpu_hours": _hours(gpu_ms)}
            for model, amount, gpu_ms in reports.totals_by(rows, "gpu_model")
        ]
        context["usage_days"] = [
            {"day": bar.label, "amount": _money(bar.total)} for bar in bars if bar.total
        ]
        context["invoices"] = [
            {"invoice": inv, "total": format_amount(inv.total_micro, inv.currency)}
            for inv in selectors.invoices_of(organization=organization).prefetch_related(
                "credit_notes"
            )[:INVOICE_ROWS]
        ]
        context["spend_alerts"] = spend_alerts.alerts_of(organization=organization)
        context["spend_alert_kinds"] = SpendAlert.Kind.choices
        context["ledger"] = [
            {"entry": e, "amount": _money(e.amount_micro), "after": _money(e.balance_after_micro)}
            for e in selectors.ledger_of(organization=organization)[:LEDGER_ROWS]
        ]
    return render(request, "portal/billing.html", context)


def _hours(gpu_milli_seconds: int) -> str:
    return f"{Decimal(gpu_milli_seconds) / reports.GPU_MS_PER_HOUR:.2f}"


@require_POST
@with_membership
def topup(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    """Opens a Checkout Session for the amount asked, then shows the link to pay at (a
    link, not a redirect: the policy lets forms post to this site only)."""
    text = request.POST.get("amount", "").strip()[:20]
    try:
        amount = from_decimal(Decimal(text))
    except (InvalidOperation, ValueError, OverflowError):
        messages.error(request, "Enter an amount such as 25 or 25.50.")
        return redirect("portal:billing")
    try:
        session = stripe_payments.create_topup(
            organization=membership.organization, user=request.user, amount_micro=amount
        )
    except (BillingRefused, PaymentProviderError) as exc:
        messages.error(request, exc.message)
        return redirect("portal:billing")
    response = render(
        request, "portal/billing_topup.html", {"topup": session, "amount": _money(amount)}
    )
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@with_membership
def stripe_portal(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    """Opens a session of Stripe's customer portal (payment methods, receipts) for the
    organisation, then shows the link to it (a link, as for a top-up). Owners and
    billing members only (the service refuses anyone else: 403)."""
    try:
        url = stripe_payments.customer_portal_url(
            organization=membership.organization, user=request.user
        )
    except (BillingRefused, PaymentProviderError) as exc:
        messages.error(request, exc.message)
        return redirect("portal:billing")
    response = render(request, "portal/billing_stripe_portal.html", {"url": url})
    response["Cache-Control"] = "no-store"
    return response


@with_membership
def invoice(
    request: AuthenticatedHttpRequest, membership: Membership, invoice_id: int
) -> HttpResponse:
    """The printable invoice (the same HTML as the API's)."""
    organization = membership.organization
    selectors.require_reader(organization=organization, user=request.user)
    found = selectors.access_invoice(organization=organization, invoice_id=int(invoice_id))
    return HttpResponse(invoice_html(found))
