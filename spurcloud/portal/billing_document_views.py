"""The portal's PDF downloads of an invoice and of a credit note: for the owners, admins
and billing members of the invoice's organisation (members: 403; another
organisation's, or a missing one: 404), the same files as the API's."""

from __future__ import annotations

from django.http import HttpResponse

from spurcloud.api.billing_documents import pdf_response
from spurcloud.billing import selectors
from spurcloud.billing.invoice_pdf import credit_note_pdf, invoice_pdf
from spurcloud.portal.membership import AuthenticatedHttpRequest, with_membership
from spurcloud.tenants.models import Membership


@with_membership
def invoice_pdf_download(
    request: AuthenticatedHttpRequest, membership: Membership, invoice_id: int
) -> HttpResponse:
    organization = membership.organization
    selectors.require_reader(organization=organization, user=request.user)
    invoice = selectors.access_invoice(organization=organization, invoice_id=int(invoice_id))
    return pdf_response(invoice_pdf(invoice), f"invoice-{invoice.number}.pdf")


@with_membership
def credit_note_pdf_download(
    request: AuthenticatedHttpRequest, membership: Membership, invoice_id: int, note_id: int
) -> HttpResponse:
    organization = membership.organization
    selectors.require_reader(organization=organization, user=request.user)
    note = selectors.access_credit_note(
        organization=organization, invoice_id=int(invoice_id), note_id=int(note_id)
    )
    return pdf_response(credit_note_pdf(note), f"credit-note-{note.number}.pdf")
