"""The credit ledger: every change of an organisation's credit is one appended entry,
written with the cached balance it leads to, in one transaction.

Locking: a writer locks the organisation's `BillingAccount` row (SELECT ... FOR UPDATE)
before it reads the balance, and nothing else after it. Metering locks its runs first
and the account last, so every writer takes locks in one order (runs by id, then the
account) and none waits on another in a cycle. Entries with a `key` (a Stripe session,
a sign-up grant) happen once: a second attempt finds the key taken and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from spurcloud.billing import bulk
from spurcloud.billing.models import BillingAccount, LedgerEntry
from spurcloud.billing.money import format_amount
from spurcloud.tenants.models import Membership, Organization

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)


def signup_key(organization: Organization) -> str:
    return f"signup:{organization.pk}"


def open_account(*, organization: Organization) -> BillingAccount:
    """The organisation's billing account, opened on first use with the site's default
    mode and, for a prepaid one, its promotional sign-up credit (granted once)."""
    account = BillingAccount.objects.filter(organization=organization).first()
    if account is not None:
        return account
    with transaction.atomic():
        account, created = BillingAccount.objects.get_or_create(
            organization=organization, defaults={"mode": settings.BILLING_DEFAULT_MODE}
        )
        credit = int(settings.BILLING_SIGNUP_CREDIT_MICRO)
        if created and credit > 0 and account.mode == BillingAccount.Mode.PREPAID:
            post_entry(
                organization=organization,
                kind=LedgerEntry.Kind.PROMOTION,
                amount_micro=credit,
                key=signup_key(organization),
                description="Sign-up credit",
            )
            account.refresh_from_db()
    return account


def low_balance_micro(account: BillingAccount) -> int:
    if account.low_balance_micro is not None:
        return int(account.low_balance_micro)
    return int(settings.BILLING_LOW_BALANCE_MICRO)


def post_entry(
    *,
    organization: Organization,
    kind: LedgerEntry.Kind,
    amount_micro: int,
    key: str | None = None,
    description: str = "",
    user: User | None = None,
) -> LedgerEntry | None:
    """Appends one entry and moves the balance by `amount_micro`; returns the entry, or
    None when `key` was used before (nothing changes). Joins the caller's transaction,
    so a caller that locked its runs first keeps the lock order."""
    with transaction.atomic():
        account = (
            BillingAccount.objects.select_for_update().filter(organization=organization).first()
        )
        if account is None:
            BillingAccount.objects.get_or_create(
                organization=organization, defaults={"mode": settings.BILLING_DEFAULT_MODE}
            )
            account = BillingAccount.objects.select_for_update().get(organization=organization)
        if key is not None and LedgerEntry.objects.filter(key=key).exists():
            return None
        before = account.balance_micro
        after = before + int(amount_micro)
        try:
            with transaction.atomic():
                entry = LedgerEntry.objects.create(
                    organization=organization,
                    kind=kind,
                    amount_micro=int(amount_micro),
                    balance_after_micro=after,
                    key=key,
                    description=description[:200],
                    created_by=user,
                )
        except IntegrityError:
            if key is not None and LedgerEntry.objects.filter(key=key).exists():
                return None
            raise
        account.balance_micro = after
        _track_state(account, after=after)
        account.save(update_fields=["balance_micro", "warned_at", "depleted_at"])
    return entry


@dataclass(frozen=True)
class Posting:
    """One entry to append, for `post_entries`."""

    organization: Organization
    kind: LedgerEntry.Kind
    amount_micro: int
    description: str = ""


def post_entries(postings: Sequence[Posting]) -> list[LedgerEntry]:
    """Appends entries (without keys) for many organisations in one go: their accounts
    are locked in one statement, ordered by organisation id (the fixed order), then the
    entries are inserted and the balances written. Metering's batches and ticks use it;
    an exempt organisation's usage and usage refunds are not posted (it is not billed).
    Joins the caller's transaction (which has locked its runs before)."""
    if not postings:
        return []
    org_ids = sorted({p.organization.pk for p in postings})
    organizations = {p.organization.pk: p.organization for p in postings}
    with transaction.atomic():
        accounts = _lock_accounts(org_ids)
        missing = [org_id for org_id in org_ids if org_id not in accounts]
        if missing:  # an organisation's first charge: rare, so locked again, all in order
            for org_id in missing:
                open_account(organization=organizations[org_id])
            accounts = _lock_accounts(org_ids)
        entries = []
        changed: dict[int, BillingAccount] = {}
        for posting in postings:
            account = accounts[posting.organization.pk]
            if account.mode == BillingAccount.Mode.EXEMPT and posting.kind in _USAGE_KINDS:
                continue
            account.organization = posting.organization  # for the warning, no query
            after = account.balance_micro + int(posting.amount_micro)
            entries.append(
                LedgerEntry(
                    organization=posting.organization,
                    kind=posting.kind,
                    amount_micro=int(posting.amount_micro),
                    balance_after_micro=after,
                    description=posting.description[:200],
                )
            )
            account.balance_micro = after
            _track_state(account, after=after)
            changed[account.pk] = account
        LedgerEntry.objects.bulk_create(entries)
        bulk.update_fields(
            BillingAccount,
            [changed[pk] for pk in sorted(changed)],
            ["balance_micro", "warned_at", "depleted_at"],
        )
    return entries


def _lock_accounts(org_ids: Sequence[int]) -> dict[int, BillingAccount]:
    """The organisations' accounts that exist, locked in organisation order: one
    statement that also tells which exist (each metering batch read that apart first)."""
    return {
        a.organization_id: a
        for a in BillingAccount.objects.select_for_update()
        .filter(organization_id__in=org_ids)
        .order_by("organization_id")
    }


_USAGE_KINDS = frozenset({LedgerEntry.Kind.USAGE, LedgerEntry.Kind.REFUND})


def _track_state(account: BillingAccount, *, after: int) -> None:
    """Marks a prepaid balance low (warned once, until it recovers) or used up (the
    grace period runs from then); a top-up that lifts it clears both."""
    now = timezone.now()
    threshold = low_balance_micro(account)
    if after > threshold:
        account.warned_at = None
    if after > 0:
        account.depleted_at = None
    if account.mode != BillingAccount.Mode.PREPAID:
        return
    if after <= 0 and account.depleted_at is None:
        account.depleted_at = now
    if after <= threshold and account.warned_at is None:
        account.warned_at = now
        organization = account.organization
        transaction.on_commit(lambda: warn_low_balance(organization=organization, balance=after))


def warn_low_balance(*, organization: Organization, balance: int) -> None:
    """Tells the organisation's owners and billing members that credit runs low."""
    payers = Membership.objects.filter(
        organization=organization, role__in=(Membership.Role.OWNER, Membership.Role.BILLING)
    ).values_list("user__email", flat=True)
    recipients = sorted({e for e in payers if e})
    amount = format_amount(balance, settings.BILLING_CURRENCY)
    log.warning("organisation %s: credit low (%s)", organization.slug, amount)
    if not recipients:
        return
    send_mail(
        subject=f"Spur-Cloud: {organization.name}'s credit is low ({amount})",
        message=(
            f"The credit of {organization.name} is {amount}. When it reaches zero, new jobs "
            "are refused and running ones are stopped after a grace period. Top it up in "
            "the portal or with POST /api/v1/billing/topups."
        ),
        from_email=None,
        recipient_list=recipients,
        fail_silently=True,
    )
