"""Invoices and credit notes as PDF (fpdf2), from the same figures as the HTML page:
the lines and total printed exactly, and they add up; downloaded through the API and
the portal by the owners, admins and billing members of the invoice's organisation
only (members 403, outsiders 404)."""

from __future__ import annotations

import io
import re
from decimal import Decimal
from typing import Any

import pytest
from pypdf import PdfReader
from rest_framework.test import APIClient

from spurcloud.billing.invoice_pdf import invoice_pdf
from spurcloud.billing.invoices import issue_credit_note
from spurcloud.billing.models import CreditNote, Invoice
from spurcloud.tenants.models import Organization
from tests.billing.conftest import Tenant
from tests.billing.test_api import _roles, used  # noqa: F401 - a fixture
from tests.spurcloud.portal.conftest import browser

pytestmark = pytest.mark.django_db
EXPECTED = {"owner": 200, "admin": 200, "billing": 200, "member": 403, "outsider": 404}


def _text(content: bytes) -> str:
    assert content.startswith(b"%PDF-")
    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(content)).pages)


@pytest.fixture
def note(used: Invoice) -> CreditNote:  # noqa: F811 - the fixture, by name
    return issue_credit_note(invoice=used, amount_micro=1_250_000, reason="outage on node07")


def test_the_pdf_prints_the_invoices_lines_and_total_exactly(
    used: Invoice,  # noqa: F811 - the fixture, by name
    note: CreditNote,
) -> None:
    text = _text(invoice_pdf(used))
    assert f"Invoice {used.number}" in text and "Acme (acme)" in text
    assert "Period: 2026-03-01 to 2026-04-01" in text
    lines = list(used.lines.all())
    assert lines
    amounts = [Decimal(a) for a in re.findall(r"([0-9]+\.[0-9]+) USD", text)]
    # Each line's amount, then the total, then the credit note: the lines add up.
    line_amounts, total = amounts[: len(lines)], amounts[len(lines)]
    assert [a * 1_000_000 for a in line_amounts] == [line.amount_micro for line in lines]
    assert sum(line_amounts) == total == Decimal(used.total_micro) / 1_000_000
    assert f"{note.number}" in text and "outage on node07" in text and "1.25 USD" in text
    # The same invoice renders to the same bytes.
    assert invoice_pdf(used) == invoice_pdf(Invoice.objects.get(pk=used.pk))


def test_a_name_outside_latin_1_prints_instead_of_failing(
    used: Invoice,  # noqa: F811 - the fixture, by name
) -> None:
    Organization.objects.filter(pk=used.organization_id).update(name="Acme 東京")
    text = _text(invoice_pdf(Invoice.objects.get(pk=used.pk)))
    assert "Acme ?? (acme)" in text


@pytest.mark.parametrize("who", list(EXPECTED))
def test_the_api_serves_the_pdfs_to_the_organisations_readers_only(
    who: str,
    used: Invoice,  # noqa: F811 - the fixture, by name
    note: CreditNote,
    acme: Tenant,
    admin_user: Any,
    billing_user: Any,
    as_outsider: APIClient,
) -> None:
    client = _roles(acme, admin_user, billing_user, as_outsider)[who]
    base = f"/api/v1/billing/invoices/{used.pk}"
    response = client.get(f"{base}/pdf")
    assert response.status_code == EXPECTED[who]
    notes = client.get(f"{base}/credit-notes/{note.pk}/pdf")
    assert notes.status_code == EXPECTED[who]
    if EXPECTED[who] == 200:
        assert response["Content-Type"] == "application/pdf"
        assert f'filename="invoice-{used.number}.pdf"' in response["Content-Disposition"]
        assert f"Invoice {used.number}" in _text(response.content)
        assert f"Credit note {note.number}" in _text(notes.content)
        assert "Against invoice" in _text(notes.content) and "1.25 USD" in _text(notes.content)
        detail = client.get(base).json()
        assert detail["credit_notes"][0]["id"] == note.pk


def test_a_credit_note_of_another_invoice_is_not_found(
    used: Invoice,  # noqa: F811 - the fixture, by name
    note: CreditNote,
    globex: Tenant,
    as_owner: APIClient,
) -> None:
    theirs = Invoice.objects.get(organization=globex.organization)
    assert as_owner.get(f"/api/v1/billing/invoices/{theirs.pk}/pdf").status_code == 404
    path = f"/api/v1/billing/invoices/{theirs.pk}/credit-notes/{note.pk}/pdf"
    assert as_owner.get(path).status_code == 404


@pytest.mark.parametrize("who", list(EXPECTED))
def test_the_portal_links_and_serves_the_pdfs_to_the_organisations_readers_only(
    who: str,
    used: Invoice,  # noqa: F811 - the fixture, by name
    note: CreditNote,
    acme: Tenant,
    admin_user: Any,
    billing_user: Any,
    globex: Tenant,
) -> None:
    people = {
        "owner": acme.owner,
        "admin": admin_user,
        "billing": billing_user,
        "member": acme.member,
        "outsider": globex.owner,
    }
    client = browser(people[who])
    response = client.get(f"/billing/invoices/{used.pk}.pdf")
    assert response.status_code == EXPECTED[who]
    notes = client.get(f"/billing/invoices/{used.pk}/credit-notes/{note.pk}.pdf")
    assert notes.status_code == EXPECTED[who]
    if EXPECTED[who] == 200:
        assert f"Invoice {used.number}" in _text(response.content)
        page = client.get("/billing/").content.decode()
        assert f'href="/billing/invoices/{used.pk}.pdf"' in page
        assert f'href="/billing/invoices/{used.pk}/credit-notes/{note.pk}.pdf"' in page
