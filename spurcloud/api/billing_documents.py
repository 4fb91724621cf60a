"""Invoices and credit notes as PDF through the web API (owners, admins and billing
members of the invoice's organisation; another's is a 404, like a missing one):

    GET /api/v1/billing/invoices/{id}/pdf
    GET /api/v1/billing/invoices/{id}/credit-notes/{note}/pdf
"""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request

from spurcloud.api.authentication import request_token, request_user
from spurcloud.api.billing import INVOICE_MISSING, ROLE
from spurcloud.api.views import AUTH, ClosedQueryApi
from spurcloud.billing import selectors
from spurcloud.billing.invoice_pdf import credit_note_pdf, invoice_pdf
from spurcloud.tenants.models import Scope

PDF = {(200, "application/pdf"): OpenApiResponse(description="The document, as a PDF file.")}


def pdf_response(content: bytes, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "private, no-store"
    return response


class InvoicePdfApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="billing_invoice_pdf",
        summary="One invoice as a PDF file",
        responses={**PDF, **AUTH, **ROLE, **INVOICE_MISSING},
    )
    def get(self, request: Request, invoice_id: int) -> HttpResponse:
        organization = request_token(request).organization
        selectors.require_reader(organization=organization, user=request_user(request))
        invoice = selectors.access_invoice(organization=organization, invoice_id=invoice_id)
        return pdf_response(invoice_pdf(invoice), f"invoice-{invoice.number}.pdf")


class CreditNotePdfApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="billing_credit_note_pdf",
        summary="One credit note of an invoice as a PDF file",
        responses={**PDF, **AUTH, **ROLE, **INVOICE_MISSING},
    )
    def get(self, request: Request, invoice_id: int, note_id: int) -> HttpResponse:
        organization = request_token(request).organization
        selectors.require_reader(organization=organization, user=request_user(request))
        note = selectors.access_credit_note(
            organization=organization, invoice_id=invoice_id, note_id=note_id
        )
        return pdf_response(credit_note_pdf(note), f"credit-note-{note.number}.pdf")
