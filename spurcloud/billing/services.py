"""Billing's writes besides metering (metering.py) and the ledger itself (ledger.py):
the credit check on submit, operators' settings and credits, and stopping the work of
an organisation whose prepaid credit ran out a grace period ago."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduler.core.contract import ACTIVE, JobAction
from spurcloud.billing.errors import BillingRefused, PaymentRequired
from spurcloud.billing.ledger import open_account, post_entry
from spurcloud.billing.models import BillingAccount, LedgerEntry
from spurcloud.billing.money import format_amount
from spurcloud.billing.quotes import Balance
from spurcloud.tenants.models import Membership, Organization

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)


def credit_used_up_message(balance_micro: int) -> str:
    return (
        "Payment required: your organisation's prepaid credit is used up (balance "
        f"{format_amount(balance_micro, settings.BILLING_CURRENCY)}). Top up in the portal's "
        "billing page (or POST /api/v1/billing/topups) to submit jobs again."
    )


def check_credit(*, organization: Organization, account: Balance | None = None) -> Balance:
    """Refuses new work (PaymentRequired, 402) when a prepaid balance is at or below
    zero. Reads the account (`account`: where the caller read it already), opened on
    first use (with its sign-up credit). Returns the account as it read it (a submission
    checks its estimate against the same row)."""
    account = account or open_account(organization=organization)
    if account.mode == BillingAccount.Mode.PREPAID and account.balance_micro <= 0:
        raise PaymentRequired(credit_used_up_message(account.balance_micro))
    return account


def set_billing_mode(*, organization: Organization, mode: str) -> BillingAccount:
    """An operator's choice: prepaid, invoiced (postpaid) or exempt."""
    if mode not in BillingAccount.Mode.values:
        raise BillingRefused(f"mode must be one of {', '.join(BillingAccount.Mode.values)}")
    account = open_account(organization=organization)
    with transaction.atomic():
        account = BillingAccount.objects.select_for_update().get(pk=account.pk)
        if mode == BillingAccount.Mode.POSTPAID and account.mode != mode:
            account.postpaid_since = timezone.now()  # reported to Stripe's meter from now
        account.mode = mode
        if mode != BillingAccount.Mode.PREPAID:
            account.depleted_at = None
        elif account.balance_micro <= 0 and account.depleted_at is None:
            account.depleted_at = timezone.now()  # the grace period starts now
        account.save(update_fields=["mode", "depleted_at", "postpaid_since"])
    return account


_OPERATOR_KINDS = {
    LedgerEntry.Kind.ADJUSTMENT,
    LedgerEntry.Kind.PROMOTION,
    LedgerEntry.Kind.REFUND,
}


def credit_organization(
    *,
    organization: Organization,
    kind: str,
    amount_micro: int,
    description: str,
    by: User | None = None,
    key: str | None = None,
) -> LedgerEntry | None:
    """An operator's entry: promotional credit, a refund, or an adjustment (either sign).
    `key` makes a repeated call a no-op."""
    if kind not in _OPERATOR_KINDS:
        raise BillingRefused("kind must be adjustment, promotion or refund", field="kind")
    if amount_micro == 0 or (kind != LedgerEntry.Kind.ADJUSTMENT and amount_micro < 0):
        raise BillingRefused("amount must be positive (an adjustment: not zero)", field="amount")
    open_account(organization=organization)
    return post_entry(
        organization=organization,
        kind=LedgerEntry.Kind(kind),
        amount_micro=amount_micro,
        key=key,
        description=description,
        user=by,
    )


def organizations_past_grace(*, now: datetime | None = None) -> list[Organization]:
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=int(settings.BILLING_GRACE_S))
    accounts = BillingAccount.objects.filter(
        mode=BillingAccount.Mode.PREPAID, balance_micro__lte=0, depleted_at__lte=cutoff
    ).select_related("organization")
    return [a.organization for a in accounts]


def stop_unpaid_work(*, organization: Organization) -> list[int]:
    """Cancels the organisation's active jobs through the job action service, acting as
    its first owner (whose right to cancel any of its jobs the service checks). Only while
    its prepaid balance is still used up past the grace period. Returns the job ids it
    cancelled."""
    # Imported here: the jobs app calls billing on submit; billing calls back only here.
    from spurcloud.jobs.models import JobRecord
    from spurcloud.jobs.services import act_on_job

    if organization not in organizations_past_grace():
        return []
    owner = (
        Membership.objects.filter(organization=organization, role=Membership.Role.OWNER)
        .select_related("user")
        .order_by("pk")
        .first()
    )
    if owner is None:
        log.error("organisation %s: credit used up, but no owner to stop its jobs as", organization)
        return []
    active = JobRecord.objects.filter(
        organization=organization, state__in=[s.value for s in ACTIVE]
    ).values_list("job_id", flat=True)
    stopped = []
    for job_id in active:
        try:
            act_on_job(
                organization=organization,
                user=owner.user,
                job_id=job_id,
                action=JobAction.CANCEL,
            )
        except Exception:  # one job's refusal (already over, 409) must not keep the rest
            log.exception("organisation %s: job %s could not be stopped", organization, job_id)
            continue
        stopped.append(job_id)
    if stopped:
        log.warning(
            "organisation %s: credit used up for %ss; stopped jobs %s",
            organization.slug,
            settings.BILLING_GRACE_S,
            stopped,
        )
    return stopped
