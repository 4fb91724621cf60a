"""Monthly invoicing: once per organisation and month, numbered uniquely by
construction, only once the month's usage is final, and one organisation's failure
never keeps the others uninvoiced."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spurcloud.billing.invoices import invoice_number, issue_last_months_invoices
from spurcloud.billing.metering import meter_job_events, meter_open_runs
from spurcloud.billing.models import Invoice, LedgerEntry, MeteredRun, UsageRecord
from spurcloud.tenants.models import Organization
from spurcloud.tenants.services import create_organization
from tests.billing.conftest import T0, Tenant, job_event, make_user, repair_money

pytestmark = pytest.mark.django_db

# T0 is in March 2026: its invoices are due once April has begun and settled.
SETTLED = datetime(2026, 4, 3, tzinfo=UTC)


def _run(job_id: int, tenant: str, seconds: int = 3661) -> list[dict[str, Any]]:
    return [
        job_event(job_id, when=0, state="RUNNING", start=0, tenant=tenant),
        job_event(job_id, when=seconds, state="COMPLETED", start=0, end=seconds, tenant=tenant),
    ]


def _organization(slug: str) -> Organization:
    return create_organization(name=slug, owner=make_user(slug[-12:]), slug=slug)


def test_last_months_invoices_are_issued_once_per_organisation(
    acme: Tenant, globex: Tenant, prices: Any
) -> None:
    meter_job_events(events=_run(7, "acme") + _run(8, "globex"))
    first = issue_last_months_invoices(now=SETTLED)
    assert sorted(i.organization.slug for i in first) == ["acme", "globex"]
    assert {i.total_micro for i in first} == {5_084_722}
    assert issue_last_months_invoices(now=SETTLED) == []  # each is issued once
    assert Invoice.objects.count() == 2


def test_slugs_that_share_their_first_characters_get_distinct_numbers(prices: Any) -> None:
    slugs = ["university-of-cambridge-physics", "university-of-cambridge-chemistry"]
    for job_id, slug in enumerate(slugs, start=20):
        _organization(slug)
        meter_job_events(events=_run(job_id, slug))
    issued = issue_last_months_invoices(now=SETTLED)
    assert sorted(i.organization.slug for i in issued) == sorted(slugs)
    numbers = {i.number for i in issued}
    assert len(numbers) == 2
    assert all(n.startswith("UNIVERSITY-O") and n.endswith("-202603") for n in numbers)


def test_one_organisations_failure_is_logged_and_leaves_the_others_invoiced(
    acme: Tenant, globex: Tenant, prices: Any, caplog: pytest.LogCaptureFixture
) -> None:
    initech = _organization("initech")
    for job_id, slug in ((7, "acme"), (8, "globex"), (9, "initech")):
        meter_job_events(events=_run(job_id, slug))
    # A row from before (an older numbering, an import) already holds globex's number:
    # its invoice cannot be created, and acme's and initech's must still be.
    march = datetime(2026, 3, 1, tzinfo=UTC)
    squatter = Invoice.objects.create(
        organization=acme.organization,
        number=invoice_number(globex.organization, march),
        period_start=datetime(2025, 1, 1, tzinfo=UTC),
        period_end=datetime(2025, 2, 1, tzinfo=UTC),
        currency="usd",
        total_micro=0,
    )
    issued = issue_last_months_invoices(now=SETTLED)
    assert sorted(i.organization.slug for i in issued) == ["acme", "initech"]
    assert "globex" in caplog.text and "invoice failed" in caplog.text
    # Repaired by hand; the next hourly run invoices globex (and only it).
    repair_money("UPDATE billing_invoice SET number = 'LEGACY-1' WHERE id = %s", [squatter.pk])
    again = issue_last_months_invoices(now=SETTLED + timedelta(hours=1))
    assert [i.organization for i in again] == [globex.organization]
    assert initech.pk in {i.organization_id for i in Invoice.objects.all()}


def test_a_month_is_invoiced_only_after_its_settling_period(
    acme: Tenant, prices: Any, settings: Any
) -> None:
    settings.BILLING_INVOICE_SETTLE_S = 86_400
    meter_job_events(events=_run(7, "acme"))
    april = datetime(2026, 4, 1, tzinfo=UTC)
    assert issue_last_months_invoices(now=april + timedelta(hours=1)) == []
    assert issue_last_months_invoices(now=april + timedelta(hours=23, minutes=59)) == []
    [invoice] = issue_last_months_invoices(now=april + timedelta(days=1))
    assert invoice.total_micro == 5_084_722


def test_an_organisation_whose_running_job_is_not_metered_to_the_months_end_waits(
    acme: Tenant, globex: Tenant, prices: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # acme's job runs from T0 into April; the tick last charged it on March 20th (the
    # beat stopped): its March is not final, whatever the calendar says.
    meter_job_events(events=[job_event(7, when=0, state="RUNNING", start=0)])
    meter_open_runs(now=T0 + timedelta(days=10))
    meter_job_events(events=_run(8, "globex"))
    issued = issue_last_months_invoices(now=SETTLED)
    assert [i.organization.slug for i in issued] == ["globex"]
    assert "not metered to the month's end" in caplog.text
    meter_open_runs(now=SETTLED)  # the beat is back
    [invoice] = issue_last_months_invoices(now=SETTLED + timedelta(hours=1))
    assert invoice.organization == acme.organization
    march_end = datetime(2026, 4, 1, tzinfo=UTC)
    hours = (march_end - T0) / timedelta(hours=1)
    assert invoice.total_micro == int(hours * 2 * 2_500_000)  # all of March, exactly


def _march(tenant: Tenant) -> list[tuple[int, int]]:
    """acme's March usage records: (id, amount)."""
    return list(
        UsageRecord.objects.filter(
            organization=tenant.organization, period_start__lt=datetime(2026, 4, 1, tzinfo=UTC)
        ).values_list("id", "amount_micro")
    )


def _march_records(tenant: Tenant) -> int:
    return sum(amount for _, amount in _march(tenant))


@pytest.fixture
def invoiced_march(acme: Tenant, prices: Any) -> Invoice:
    """acme's job runs from T0 (March 10th) on; its end never reached metering, so the
    tick charged it on; March was invoiced on April 3rd."""
    meter_job_events(events=[job_event(7, when=0, state="RUNNING", start=0)])
    meter_open_runs(now=SETTLED)
    [invoice] = issue_last_months_invoices(now=SETTLED)
    meter_open_runs(now=SETTLED + timedelta(hours=1))
    return invoice


def test_an_end_found_after_the_invoice_rewrites_no_invoiced_usage(
    acme: Tenant, invoiced_march: Invoice
) -> None:
    assert _march_records(acme) == invoiced_march.total_micro
    march = _march(acme)
    charged = MeteredRun.objects.get(job_id=7).charged_micro
    # The job had ended on April 2nd at midnight (reconciliation, or a late event).
    end_s = (datetime(2026, 4, 2, tzinfo=UTC) - T0).total_seconds()
    meter_job_events(events=[job_event(7, when=end_s, state="COMPLETED", start=0, end=end_s)])
    assert _march(acme) == march  # the very records the invoice summed, untouched
    run = MeteredRun.objects.get(job_id=7)
    assert run.ended_at == datetime(2026, 4, 2, tzinfo=UTC)
    # Charged again from April 1st only: 22.5 days of March and the 1st of April.
    assert run.charged_micro == (21 * 24 + 12 + 24) * 5_000_000
    refund = LedgerEntry.objects.get(kind="refund")
    assert refund.amount_micro == charged - run.charged_micro == 25 * 5_000_000


def test_an_end_inside_an_invoiced_month_closes_the_run_at_the_months_end(
    acme: Tenant, invoiced_march: Invoice, caplog: pytest.LogCaptureFixture
) -> None:
    end_s = (datetime(2026, 3, 31, 12, tzinfo=UTC) - T0).total_seconds()
    meter_job_events(events=[job_event(7, when=end_s, state="COMPLETED", start=0, end=end_s)])
    # The invoice keeps what it billed (a credit note corrects it); April is given back.
    assert _march_records(acme) == invoiced_march.total_micro
    run = MeteredRun.objects.get(job_id=7)
    assert run.ended_at == datetime(2026, 4, 1, tzinfo=UTC)
    assert run.charged_micro == invoiced_march.total_micro
    assert "in a month already invoiced" in caplog.text
    assert LedgerEntry.objects.get(kind="refund").amount_micro == (2 * 24 + 1) * 5_000_000
