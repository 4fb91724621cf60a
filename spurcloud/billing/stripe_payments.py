"""Stripe, through the official library: one customer per organisation, Checkout
Sessions for top-ups, and the webhook that credits them.

Every write carries an idempotency key (a retried request creates nothing twice). The
webhook verifies `Stripe-Signature` on the raw body, records the event id (unique) in
one transaction and fulfils it after commit, in a Celery task; a top-up is credited
once, keyed by its session, however often Stripe delivers the event.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import stripe
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from spurcloud.billing.errors import BillingRefused, PaymentProviderError
from spurcloud.billing.ledger import open_account, post_entry
from spurcloud.billing.models import MICRO, BillingAccount, LedgerEntry, StripeEvent, TopUp
from spurcloud.billing.money import format_amount
from spurcloud.billing.selectors import require_payer
from spurcloud.tenants.models import Organization

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)

MICRO_PER_CENT = MICRO // 100
PAID_EVENTS = frozenset({"checkout.session.completed", "checkout.session.async_payment_succeeded"})
EXPIRED_EVENT = "checkout.session.expired"
RECONCILE_BATCH = 1000  # sessions asked about per run


def stripe_client() -> stripe.StripeClient:
    if not settings.STRIPE_SECRET_KEY:
        raise PaymentProviderError("Payments are not configured on this site (STRIPE_SECRET_KEY).")
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY,
        base_addresses={"api": settings.STRIPE_API_BASE},
        max_network_retries=2,
    )


def ensure_customer(*, organization: Organization) -> str:
    """The organisation's Stripe customer id, created once (keyed by the organisation)."""
    account = open_account(organization=organization)
    if account.stripe_customer_id:
        return account.stripe_customer_id
    try:
        customer = stripe_client().v1.customers.create(
            params={
                "name": organization.name,
                "metadata": {"organization_id": str(organization.pk), "slug": organization.slug},
            },
            options={"idempotency_key": f"spur-customer-{organization.pk}"},
        )
    except stripe.StripeError as exc:
        raise PaymentProviderError(f"Stripe refused to create the customer: {exc}") from exc
    # Conditional: two requests racing here store the same id (same idempotency key).
    BillingAccount.objects.filter(pk=account.pk, stripe_customer_id="").update(
        stripe_customer_id=customer.id
    )
    return str(customer.id)


def create_topup(
    *, organization: Organization, user: User, amount_micro: int, idempotency_key: str = ""
) -> TopUp:
    """A Checkout Session for `amount_micro` of credit (bounded, whole cents); returns the
    top-up with the URL to pay at. Owners and billing members only."""
    require_payer(organization=organization, user=user)
    low, high = int(settings.BILLING_TOPUP_MIN_MICRO), int(settings.BILLING_TOPUP_MAX_MICRO)
    currency = settings.BILLING_CURRENCY
    if not low <= amount_micro <= high:
        raise BillingRefused(
            f"amount must be between {format_amount(low, currency)} and "
            f"{format_amount(high, currency)}",
            field="amount",
        )
    if amount_micro % MICRO_PER_CENT:
        raise BillingRefused("amount must be a whole number of cents", field="amount")
    customer = ensure_customer(organization=organization)
    key = idempotency_key or uuid.uuid4().hex
    try:
        session = stripe_client().v1.checkout.sessions.create(
            params={
                "mode": "payment",
                "customer": customer,
                "client_reference_id": str(organization.pk),
                "line_items": [
                    {
                        "quantity": 1,
                        "price_data": {
                            "currency": currency,
                            "unit_amount": amount_micro // MICRO_PER_CENT,
                            "product_data": {"name": f"Spur-Cloud credit for {organization.name}"},
                        },
                    }
                ],
                "metadata": {
                    "organization_id": str(organization.pk),
                    "amount_micro": str(amount_micro),
                },
                "success_url": f"{settings.BILLING_RETURN_URL}?topup=done",
                "cancel_url": f"{settings.BILLING_RETURN_URL}?topup=cancelled",
            },
            options={"idempotency_key": f"spur-topup-{organization.pk}-{key}"},
        )
    except stripe.StripeError as exc:
        raise PaymentProviderError(f"Stripe refused the checkout session: {exc}") from exc
    topup, _ = TopUp.objects.get_or_create(
        session_id=session.id,
        defaults={
            "organization": organization,
            "amount_micro": amount_micro,
            "url": session.url or "",
            "created_by": user,
        },
    )
    return topup


def customer_portal_url(*, organization: Organization, user: User) -> str:
    """A Stripe customer portal session (payment methods, receipts) for the
    organisation's customer; owners and billing members only."""
    require_payer(organization=organization, user=user)
    customer = ensure_customer(organization=organization)
    try:
        session = stripe_client().v1.billing_portal.sessions.create(
            params={"customer": customer, "return_url": settings.BILLING_RETURN_URL},
            options={"idempotency_key": f"spur-portal-{organization.pk}-{uuid.uuid4().hex}"},
        )
    except stripe.StripeError as exc:
        raise PaymentProviderError(f"Stripe refused the portal session: {exc}") from exc
    return str(session.url)


def receive_webhook(*, payload: bytes, signature: str) -> bool:
    """Verifies and records a webhook delivery; True when the event is new (its
    fulfilment then runs after commit), False for a replay. BillingRefused (400) for a
    bad signature or body: nothing is recorded."""
    if not settings.STRIPE_WEBHOOK_SECRET:
        raise PaymentProviderError("Payments are not configured on this site.")
    try:
        event = stripe.Webhook.construct_event(payload, signature, settings.STRIPE_WEBHOOK_SECRET)
    except stripe.SignatureVerificationError as exc:
        raise BillingRefused("invalid Stripe-Signature") from exc
    except ValueError as exc:
        raise BillingRefused("the body is not a Stripe event") from exc
    from spurcloud.billing.tasks import fulfil_stripe_event

    try:
        with transaction.atomic():
            record = StripeEvent.objects.create(
                event_id=str(event.id), type=str(event.type), payload=event.to_dict()
            )
            transaction.on_commit(lambda: fulfil_stripe_event.delay(record.pk))
    except IntegrityError:
        return False  # delivered before: recorded, and fulfilled (or being fulfilled)
    return True


def fulfil_event(*, event_pk: int) -> bool:
    """Acts on a recorded event once (a conditional claim on `processed_at`); True when
    it credited a top-up."""
    with transaction.atomic():
        claimed = StripeEvent.objects.filter(pk=event_pk, processed_at__isnull=True).update(
            processed_at=timezone.now()
        )
        if not claimed:
            return False
        event = StripeEvent.objects.get(pk=event_pk)
        session: dict[str, Any] = event.payload.get("data", {}).get("object", {})
        if event.type == EXPIRED_EVENT:
            _expire_session(str(session.get("id", "")))
            return False
        if event.type not in PAID_EVENTS:
            return False
        if session.get("payment_status") != "paid":
            return False
        return _credit_session(session)


def _expire_session(session_id: str) -> bool:
    """Marks an open top-up expired (conditionally: a paid one stays paid)."""
    return bool(
        TopUp.objects.filter(session_id=session_id, status=TopUp.Status.OPEN).update(
            status=TopUp.Status.EXPIRED, expired_at=timezone.now()
        )
    )


def _credit_session(session: dict[str, Any]) -> bool:
    topup = TopUp.objects.filter(session_id=str(session.get("id", ""))).first()
    if topup is None:
        log.error("stripe: paid session %s matches no top-up", session.get("id"))
        return False
    paid_cents = int(session.get("amount_total") or 0)
    if paid_cents * MICRO_PER_CENT != topup.amount_micro:
        log.error(
            "stripe: session %s paid %s cents for a top-up of %s micro-units; not credited",
            topup.session_id,
            paid_cents,
            topup.amount_micro,
        )
        return False
    # From open, or from expired: Stripe never takes money for an expired session, but
    # if it says this one was paid, the money is ours and the credit is the renter's.
    unpaid = [TopUp.Status.OPEN, TopUp.Status.EXPIRED]
    if not TopUp.objects.filter(pk=topup.pk, status__in=unpaid).update(
        status=TopUp.Status.PAID, paid_at=timezone.now()
    ):
        return False
    entry = post_entry(
        organization=topup.organization,
        kind=LedgerEntry.Kind.TOP_UP,
        amount_micro=topup.amount_micro,
        key=f"stripe-session:{topup.session_id}",
        description="Top-up (Stripe Checkout)",
        user=topup.created_by,
    )
    return entry is not None


def reconcile_topups(*, older_than_s: int = 600, batch: int = RECONCILE_BATCH) -> int:
    """Asks Stripe about top-ups still open after `older_than_s`, oldest first (at most
    `batch` a run): a paid one whose webhook never arrived (or was refused) is
    credited now, once (the same keyed entry the webhook would make); one whose session
    expired unpaid is marked expired, so that abandoned checkouts leave the open set
    and never crowd out a paid one. Returns how many it credited."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    topups = list(
        TopUp.objects.filter(status=TopUp.Status.OPEN, created_at__lt=cutoff).order_by("pk")[:batch]
    )
    if not topups:
        return 0  # nothing to ask (and a site without Stripe has nothing to reconcile)
    client = stripe_client()
    credited = expired = 0
    for topup in topups:
        try:
            session = client.v1.checkout.sessions.retrieve(topup.session_id)
        except stripe.StripeError as exc:
            log.warning("stripe: session %s could not be read: %s", topup.session_id, exc)
            continue
        data = session.to_dict()
        if data.get("payment_status") == "paid":
            with transaction.atomic():
                if _credit_session(data):
                    credited += 1
                    log.warning("stripe: top-up %s credited by reconciliation", topup.session_id)
        elif data.get("status") == "expired" and _expire_session(topup.session_id):
            expired += 1
    if expired:
        log.info("stripe: %s abandoned top-ups marked expired", expired)
    return credited
