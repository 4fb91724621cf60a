"""Spend alerts: thresholds an organisation watches (this month's spend above X, the
balance below Y). The beat task `spur.billing.check_spend_alerts` compares them with the
month's usage and the balance; an alert crossed records a `SpendAlertFiring` (unique per
alert and calendar month, UTC) and, after commit, mails the owners and billing members:
once per month however often it runs, and a retried task sends nothing twice. Owners
and billing members set and remove alerts; owners, admins and billing members see them
(the portal's billing page).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.http import Http404
from django.utils import timezone

from spurcloud.billing.errors import BillingRefused
from spurcloud.billing.models import (
    BillingAccount,
    SpendAlert,
    SpendAlertFiring,
    UsageRecord,
)
from spurcloud.billing.money import format_amount
from spurcloud.billing.pricing import month_start
from spurcloud.billing.selectors import require_payer
from spurcloud.tenants.models import Membership, Organization

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)

MAX_ALERTS = 20  # per organisation
MAX_THRESHOLD_MICRO = 10**15  # a billion units of the currency


def create_spend_alert(
    *, organization: Organization, user: User, kind: str, threshold_micro: int
) -> SpendAlert:
    require_payer(organization=organization, user=user)
    if kind not in SpendAlert.Kind.values:
        raise BillingRefused(
            f"kind must be one of {', '.join(SpendAlert.Kind.values)}", field="kind"
        )
    if abs(threshold_micro) > MAX_THRESHOLD_MICRO:
        raise BillingRefused("the threshold is too large", field="threshold")
    if kind == SpendAlert.Kind.MONTHLY_SPEND_ABOVE and threshold_micro <= 0:
        raise BillingRefused("a spend threshold must be above zero", field="threshold")
    with transaction.atomic():
        # The organisation's row serialises its alert writers (the count below).
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        if SpendAlert.objects.filter(organization=organization).count() >= MAX_ALERTS:
            raise BillingRefused(f"at most {MAX_ALERTS} spend alerts per organisation")
        try:
            with transaction.atomic():
                return SpendAlert.objects.create(
                    organization=organization,
                    kind=kind,
                    threshold_micro=threshold_micro,
                    created_by=user,
                )
        except IntegrityError:
            raise BillingRefused("that alert is already set", field="threshold") from None


def delete_spend_alert(*, organization: Organization, user: User, alert_id: int) -> None:
    require_payer(organization=organization, user=user)
    deleted, _ = SpendAlert.objects.filter(organization=organization, pk=alert_id).delete()
    if not deleted:
        raise Http404(f"Spend alert {alert_id} not found.")


@dataclass(frozen=True)
class AlertView:
    alert: SpendAlert
    text: str
    fired: SpendAlertFiring | None  # this month's


def describe(alert: SpendAlert) -> str:
    threshold = format_amount(alert.threshold_micro, settings.BILLING_CURRENCY)
    return f"{alert.get_kind_display()} {threshold}"


def alerts_of(*, organization: Organization, now: datetime | None = None) -> list[AlertView]:
    """The organisation's alerts, each with whether (and at what) it fired this month."""
    month = month_start(now or timezone.now())
    alerts = list(SpendAlert.objects.filter(organization=organization))
    fired = {
        f.alert_id: f for f in SpendAlertFiring.objects.filter(alert__in=alerts, period_start=month)
    }
    return [AlertView(a, describe(a), fired.get(a.pk)) for a in alerts]


def check_spend_alerts(*, now: datetime | None = None) -> int:
    """Fires every alert crossed now that has not fired this month; returns how many."""
    now = now or timezone.now()
    month = month_start(now)
    alerts = list(SpendAlert.objects.select_related("organization").order_by("pk"))
    if not alerts:
        return 0
    org_ids = {a.organization_id for a in alerts}
    spend = dict(
        UsageRecord.objects.filter(
            organization_id__in=org_ids, period_start__gte=month, period_start__lt=now
        )
        .values_list("organization_id")
        .annotate(total=Sum("amount_micro"))
        .order_by()
    )
    balances = dict(
        BillingAccount.objects.filter(organization_id__in=org_ids).values_list(
            "organization_id", "balance_micro"
        )
    )
    fired = 0
    for alert in alerts:
        if alert.kind == SpendAlert.Kind.MONTHLY_SPEND_ABOVE:
            value = int(spend.get(alert.organization_id) or 0)
            crossed = value > alert.threshold_micro
        else:
            if alert.organization_id not in balances:
                continue  # no account yet: nothing to compare
            value = int(balances[alert.organization_id])
            crossed = value < alert.threshold_micro
        if crossed and _fire(alert, month=month, value=value):
            fired += 1
    return fired


def _fire(alert: SpendAlert, *, month: datetime, value: int) -> bool:
    with transaction.atomic():
        _, created = SpendAlertFiring.objects.get_or_create(
            alert=alert, period_start=month, defaults={"value_micro": value}
        )
        if created:
            transaction.on_commit(lambda: mail_alert(alert=alert, value=value))
    return created


def mail_alert(*, alert: SpendAlert, value: int) -> None:
    """Tells the organisation's owners and billing members that an alert fired."""
    organization = alert.organization
    payers = Membership.objects.filter(
        organization=organization, role__in=(Membership.Role.OWNER, Membership.Role.BILLING)
    ).values_list("user__email", flat=True)
    recipients = sorted({e for e in payers if e})
    amount = format_amount(value, settings.BILLING_CURRENCY)
    what = "spend this month" if alert.kind == SpendAlert.Kind.MONTHLY_SPEND_ABOVE else "balance"
    log.info("organisation %s: spend alert %s fired (%s)", organization.slug, alert.pk, amount)
    if not recipients:
        return
    send_mail(
        subject=f"Spur-Cloud: {organization.name}'s {what} is {amount} ({describe(alert)})",
        message=(
            f'The spend alert of {organization.name} "{describe(alert)}" was crossed: its '
            f"{what} is {amount}. This alert mails once per calendar month (UTC); see or "
            "change your alerts in the portal's billing page."
        ),
        from_email=None,
        recipient_list=recipients,
        fail_silently=True,
    )
