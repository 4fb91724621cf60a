"""`post_entries`, metering's ledger writer: the accounts locked in one statement, in
organisation order; an organisation's first charge opens its account first."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from spurcloud.billing.ledger import Posting, open_account, post_entries
from spurcloud.billing.models import BillingAccount, LedgerEntry
from tests.billing.conftest import Tenant

pytestmark = pytest.mark.django_db


def _usage(tenant: Tenant, micro: int) -> Posting:
    return Posting(tenant.organization, LedgerEntry.Kind.USAGE, -micro, "usage")


def _balance(tenant: Tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro


def test_existing_accounts_are_read_and_locked_in_one_statement(
    acme: Tenant, globex: Tenant
) -> None:
    for tenant in (acme, globex):
        open_account(organization=tenant.organization)
    before = {t.organization.pk: _balance(t) for t in (acme, globex)}
    with CaptureQueriesContext(connection) as queries:
        post_entries([_usage(globex, 7), _usage(acme, 5)])
    reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
    assert len(reads) == 1 and "FOR UPDATE" in reads[0]
    assert reads[0].index("ORDER BY") > 0  # in organisation order
    assert _balance(acme) == before[acme.organization.pk] - 5
    assert _balance(globex) == before[globex.organization.pk] - 7


def test_an_organisations_first_charge_opens_its_account(acme: Tenant, globex: Tenant) -> None:
    open_account(organization=acme.organization)
    BillingAccount.objects.filter(organization=globex.organization).delete()
    LedgerEntry.objects.filter(organization=globex.organization).delete()
    acme_before = _balance(acme)
    entries = post_entries([_usage(acme, 5), _usage(globex, 7)])
    assert len(entries) == 2
    opened = open_account(organization=globex.organization)  # the one posted to
    credit = LedgerEntry.objects.filter(
        organization=globex.organization, kind=LedgerEntry.Kind.PROMOTION
    )
    granted = sum(e.amount_micro for e in credit)
    assert opened.balance_micro == granted - 7
    assert _balance(acme) == acme_before - 5
    assert BillingAccount.objects.filter(organization=globex.organization).count() == 1
