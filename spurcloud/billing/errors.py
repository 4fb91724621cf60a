"""What the billing services raise (the API answers each with its status)."""

from __future__ import annotations


class PaymentRequired(Exception):
    """The organisation's prepaid credit is used up: new work is refused (402)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BillingRefused(Exception):
    """A billing request refused as invalid, with a message for the user (400)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class PaymentProviderError(Exception):
    """Stripe could not be reached or refused a request (502)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ImmutableRecord(BillingRefused):
    """A record of money that is never edited or deleted (a ledger entry, an invoice, a
    price in effect): a mistake is corrected by a new record."""
