"""Invoices and credit notes as PDF, with fpdf2 (pure Python, no system libraries):
the same figures as the HTML page (`invoices.invoice_document`), laid out on A4.

The built-in PDF fonts (Helvetica) hold Latin-1 only: other characters (an
organisation's name in another script) print as "?" rather than fail the download.
A document's creation date is the invoice's (or note's) issue time, so the same
invoice renders to the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fpdf import FPDF
from fpdf.enums import XPos, YPos

from spurcloud.billing.invoices import invoice_document
from spurcloud.billing.models import CreditNote, Invoice
from spurcloud.billing.money import format_amount

SITE = "Spur-Cloud"


def _latin1(text: Any) -> str:
    return str(text).encode("latin-1", "replace").decode("latin-1")


class _Document(FPDF):
    def __init__(self, title: str) -> None:
        super().__init__(format="A4")
        self.set_title(_latin1(title))
        self.set_author(SITE)
        self.set_creator(SITE)
        self.set_auto_page_break(auto=True, margin=15)
        self.add_page()

    def heading(self, text: str) -> None:
        self.set_font("Helvetica", "B", 16)
        self.cell(0, 10, _latin1(text), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def line_of_text(self, text: str, *, bold: bool = False) -> None:
        self.set_font("Helvetica", "B" if bold else "", 10)
        self.cell(0, 6, _latin1(text), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def grid(self, rows: Sequence[tuple[str, ...]], widths: tuple[int, ...], align: str) -> None:
        """A table: the first row is the heading; `align` has one L or R per column."""
        self.set_font("Helvetica", "", 10)
        alignment = tuple("RIGHT" if a == "R" else "LEFT" for a in align)
        with self.table(col_widths=widths, text_align=alignment, first_row_as_headings=True) as t:
            for row in rows:
                cells = t.row()
                for value in row:
                    cells.cell(_latin1(value))
        self.ln(4)


def invoice_pdf(invoice: Invoice) -> bytes:
    """The invoice, its lines, total and credit notes, as a PDF document."""
    data = invoice_document(invoice)
    doc = _Document(f"Invoice {invoice.number}")
    doc.set_creation_date(invoice.issued_at)
    organization = invoice.organization
    doc.heading(f"Invoice {invoice.number}")
    doc.line_of_text(f"{organization.name} ({organization.slug})")
    doc.line_of_text(
        f"Period: {invoice.period_start:%Y-%m-%d} to {invoice.period_end:%Y-%m-%d} "
        "(UTC, end exclusive)"
    )
    doc.line_of_text(f"Issued: {invoice.issued_at:%Y-%m-%d %H:%M} UTC")
    doc.ln(4)
    rows = [("GPU model", "QoS", "GPU-hours", "Amount")]
    rows += [(ln["gpu_model"], ln["qos"], ln["gpu_hours"], ln["amount"]) for ln in data["lines"]]
    if not data["lines"]:
        rows.append(("No usage this month.", "", "", ""))
    rows.append(("Total", "", "", data["total"]))
    doc.grid(rows, (50, 50, 40, 50), "LLRR")
    if data["credit_notes"]:
        doc.line_of_text("Credit notes", bold=True)
        notes = [("Number", "Reason", "Amount")]
        notes += [(n["number"], n["reason"], n["amount"]) for n in data["credit_notes"]]
        doc.grid(notes, (55, 90, 45), "LLR")
    return bytes(doc.output())


def credit_note_pdf(note: CreditNote) -> bytes:
    """A credit note against an invoice, as a PDF document."""
    invoice = note.invoice
    doc = _Document(f"Credit note {note.number}")
    doc.set_creation_date(note.created_at)
    doc.heading(f"Credit note {note.number}")
    doc.line_of_text(f"{invoice.organization.name} ({invoice.organization.slug})")
    doc.line_of_text(f"Against invoice {invoice.number} ({invoice.period_start:%Y-%m})")
    doc.line_of_text(f"Issued: {note.created_at:%Y-%m-%d %H:%M} UTC")
    doc.ln(4)
    doc.grid(
        [
            ("Reason", "Amount credited"),
            (note.reason, format_amount(note.amount_micro, invoice.currency)),
        ],
        (130, 60),
        "LR",
    )
    return bytes(doc.output())
