"""The portal's spend alerts (`spurcloud.billing.spend_alerts`): owners and billing
members add and remove them on the billing page (which lists them, with this month's
firing, to owners, admins and billing members)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from spurcloud.billing import spend_alerts
from spurcloud.billing.errors import BillingRefused
from spurcloud.billing.money import from_decimal
from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.tenants.models import Membership


@require_POST
@with_membership
def spend_alert_add(request: AuthenticatedHttpRequest, membership: Membership) -> HttpResponse:
    text = request.POST.get("threshold", "").strip()[:24]
    try:
        threshold = from_decimal(Decimal(text))
    except (InvalidOperation, ValueError, OverflowError):
        messages.error(request, "Enter a threshold such as 100 or 99.50.")
        return redirect("portal:billing")
    try:
        alert = spend_alerts.create_spend_alert(
            organization=membership.organization,
            user=request.user,
            kind=request.POST.get("kind", "")[:32],
            threshold_micro=threshold,
        )
    except BillingRefused as exc:
        messages.error(request, f"Spend alert not added: {exc.message}.")
        return redirect("portal:billing")
    except PermissionDenied as exc:
        messages.error(request, str(exc))
        return redirect("portal:billing")
    messages.success(request, f"Spend alert added: {spend_alerts.describe(alert)}.")
    return redirect("portal:billing")


@require_POST
@with_membership
def spend_alert_delete(
    request: AuthenticatedHttpRequest, membership: Membership, alert_id: int
) -> HttpResponse:
    try:
        spend_alerts.delete_spend_alert(
            organization=membership.organization, user=request.user, alert_id=int(alert_id)
        )
    except PermissionDenied as exc:
        messages.error(request, str(exc))
        return redirect("portal:billing")
    messages.success(request, "Spend alert removed.")
    return redirect("portal:billing")
