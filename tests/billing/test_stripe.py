"""Top-ups through Stripe Checkout and the webhook, against a local fake of Stripe's API
(tests/fixtures/stripe_fake.py) that the real `stripe` library talks to."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from spurcloud.billing.errors import BillingRefused
from spurcloud.billing.models import BillingAccount, LedgerEntry, StripeEvent, TopUp
from spurcloud.billing.stripe_payments import create_topup
from tests.billing.conftest import Tenant, api_client
from tests.fixtures.stripe_fake import FakeStripe, sign

pytestmark = pytest.mark.django_db

SIGNUP = 10_000_000
WEBHOOK = "/billing/stripe/webhook"


def _top_up(client: APIClient, amount: str = "25.00", key: str = "") -> Any:
    """A top-up of `amount` (currency units, as text) through the API."""
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    cents: Any = int(Decimal(amount) * 100) if amount.replace(".", "").isdigit() else amount
    return client.post("/api/v1/billing/topups", {"amount_cents": cents}, format="json", **headers)


def _deliver(event: dict[str, Any], *, signature: str | None = None) -> Any:
    body = json.dumps(event).encode()
    return APIClient().generic(
        "POST",
        WEBHOOK,
        body,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body) if signature is None else signature,
    )


def _balance(tenant: Tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro


def test_a_top_up_opens_a_checkout_session_for_the_organisations_customer(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe
) -> None:
    response = _top_up(as_owner, "25.00")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["url"].startswith("https://checkout.stripe.test/")
    assert body["amount_micro"] == 25_000_000
    session = stripe_fake.sessions[body["session_id"]]
    assert session["amount_total"] == 2500 and session["currency"] == "usd"
    assert session["customer"] in stripe_fake.customers
    account = BillingAccount.objects.get(organization=acme.organization)
    assert account.stripe_customer_id == session["customer"]
    # Every write carried an idempotency key.
    assert all(r["key"] for r in stripe_fake.requests if r["method"] == "POST")
    # A second top-up reuses the customer.
    assert _top_up(as_owner, "10.00").status_code == 201
    assert len(stripe_fake.customers) == 1


def test_a_retried_top_up_with_the_same_key_opens_one_session(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe
) -> None:
    first = _top_up(as_owner, key="k1").json()
    second = _top_up(as_owner, key="k1").json()
    assert first["session_id"] == second["session_id"]
    assert len(stripe_fake.sessions) == 1 and TopUp.objects.count() == 1


@pytest.mark.parametrize(
    "amount,message",
    [("1.00", "greater"), ("100000000.00", "less"), ("abc", "integer")],
)
def test_a_top_up_out_of_bounds_is_refused_and_opens_nothing(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe, amount: str, message: str
) -> None:
    response = _top_up(as_owner, amount)
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert "amount_cents" in response.json()["errors"]
    assert not stripe_fake.sessions


@pytest.mark.parametrize(
    "amount,message", [(25_005_000, "whole number of cents"), (1_000_000, "between")]
)
def test_the_service_refuses_fractions_of_a_cent_and_amounts_out_of_bounds(
    acme: Tenant, stripe_fake: FakeStripe, amount: int, message: str
) -> None:
    with pytest.raises(BillingRefused, match=message):
        create_topup(organization=acme.organization, user=acme.owner, amount_micro=amount)
    assert not stripe_fake.sessions


def test_the_paid_webhook_credits_the_top_up_exactly_once(
    acme: Tenant,
    as_owner: APIClient,
    stripe_fake: FakeStripe,
    eager_celery: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    session_id = _top_up(as_owner, "25.00").json()["session_id"]
    event = stripe_fake.pay(session_id)
    with django_capture_on_commit_callbacks(execute=True):
        response = _deliver(event)
    assert response.status_code == 200 and response.json()["duplicate"] is False
    assert _balance(acme) == SIGNUP + 25_000_000
    assert TopUp.objects.get(session_id=session_id).status == "paid"
    # Stripe retries: the same event, delivered again, changes nothing.
    with django_capture_on_commit_callbacks(execute=True):
        again = _deliver(event)
    assert again.json()["duplicate"] is True
    # A different event for the same session (e.g. async_payment_succeeded) neither.
    other = {**event, "id": "evt_other", "type": "checkout.session.async_payment_succeeded"}
    with django_capture_on_commit_callbacks(execute=True):
        assert _deliver(other).status_code == 200
    assert _balance(acme) == SIGNUP + 25_000_000
    assert LedgerEntry.objects.filter(kind="top_up").count() == 1
    assert StripeEvent.objects.count() == 2


def test_a_forged_signature_is_refused_and_changes_nothing(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe, eager_celery: Any
) -> None:
    session_id = _top_up(as_owner, "25.00").json()["session_id"]
    event = stripe_fake.pay(session_id)
    body = json.dumps(event).encode()
    forged = sign(body, secret="whsec_not_the_secret")
    assert _deliver(event, signature=forged).status_code == 400
    assert _deliver(event, signature="").status_code == 400
    # A signature of another body: the amount was changed on the way.
    tampered = {**event, "data": {"object": {**event["data"]["object"], "amount_total": 999999}}}
    response = _deliver(tampered, signature=sign(body))
    assert response.status_code == 400
    assert not StripeEvent.objects.exists()
    assert _balance(acme) == SIGNUP


def test_an_old_signature_is_refused_as_a_replay(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe
) -> None:
    session_id = _top_up(as_owner, "25.00").json()["session_id"]
    event = stripe_fake.pay(session_id)
    body = json.dumps(event).encode()
    stale = sign(body, timestamp=1_600_000_000)
    assert _deliver(event, signature=stale).status_code == 400
    assert not StripeEvent.objects.exists()


def test_a_paid_event_for_an_unknown_session_credits_nothing(
    acme: Tenant,
    stripe_fake: FakeStripe,
    eager_celery: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    event = {
        "id": "evt_x",
        "object": "event",
        "type": "checkout.session.completed",
        "data": {"object": {"id": "cs_unknown", "payment_status": "paid", "amount_total": 100}},
    }
    with django_capture_on_commit_callbacks(execute=True):
        assert _deliver(event).status_code == 200
    assert not LedgerEntry.objects.filter(kind="top_up").exists()


def test_members_admins_and_outsiders_cannot_top_up_acme(
    acme: Tenant,
    as_member: APIClient,
    admin_user: Any,
    billing_user: Any,
    as_outsider: APIClient,
    stripe_fake: FakeStripe,
) -> None:
    assert _top_up(as_member).status_code == 403
    assert _top_up(api_client(admin_user, acme.organization)).status_code == 403
    assert _top_up(api_client(billing_user, acme.organization)).status_code == 201
    # An outsider's token tops up its own organisation, never acme.
    assert _top_up(as_outsider).status_code == 201
    assert TopUp.objects.filter(organization=acme.organization).count() == 1


def test_a_top_up_when_stripe_is_not_configured_is_a_clear_error(
    acme: Tenant, as_owner: APIClient, settings: Any
) -> None:
    settings.STRIPE_SECRET_KEY = ""
    response = _top_up(as_owner)
    assert response.status_code == 502
    assert "not configured" in response.json()["detail"]


def test_the_webhook_refuses_other_methods_and_oversized_or_empty_bodies(
    stripe_fake: FakeStripe,
) -> None:
    client = APIClient()
    assert client.get(WEBHOOK).status_code == 405
    big = b"{" + b" " * (300 * 1024) + b"}"
    response = client.generic(
        "POST", WEBHOOK, big, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(big)
    )
    assert response.status_code == 400
    empty = client.generic("POST", WEBHOOK, b"", content_type="application/json")
    assert empty.status_code == 400
    assert not StripeEvent.objects.exists()


def test_a_paid_top_up_whose_webhook_was_lost_is_credited_by_reconciliation_once(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe
) -> None:
    from spurcloud.billing.stripe_payments import reconcile_topups

    paid = _top_up(as_owner, "25.00").json()["session_id"]
    _top_up(as_owner, "10.00")  # never paid
    stripe_fake.pay(paid)  # ... and its event never delivered
    assert reconcile_topups(older_than_s=0) == 1
    assert reconcile_topups(older_than_s=0) == 0
    assert _balance(acme) == SIGNUP + 25_000_000
    # The webhook arriving late changes nothing.
    assert TopUp.objects.get(session_id=paid).status == "paid"


def test_owners_and_billing_contacts_open_the_customer_portal_and_others_cannot(
    acme: Tenant,
    as_member: APIClient,
    admin_user: Any,
    billing_user: Any,
    stripe_fake: FakeStripe,
) -> None:
    for user in (acme.owner, billing_user):
        response = api_client(user, acme.organization).post("/api/v1/billing/portal")
        assert response.status_code == 201, response.json()
        assert response.json()["url"].startswith("https://billing.stripe.test/p/session/")
    assert as_member.post("/api/v1/billing/portal").status_code == 403
    assert (
        api_client(admin_user, acme.organization).post("/api/v1/billing/portal").status_code == 403
    )
    assert len(stripe_fake.customers) == 1


def test_an_expired_session_marks_its_top_up_expired_and_credits_nothing(
    acme: Tenant,
    as_owner: APIClient,
    stripe_fake: FakeStripe,
    eager_celery: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    session_id = _top_up(as_owner, "25.00").json()["session_id"]
    event = stripe_fake.expire(session_id)
    for _ in range(2):  # delivered twice: the second is a duplicate
        with django_capture_on_commit_callbacks(execute=True):
            assert _deliver(event).status_code == 200
    topup = TopUp.objects.get(session_id=session_id)
    assert (topup.status, topup.paid_at) == ("expired", None)
    assert topup.expired_at is not None
    assert _balance(acme) == SIGNUP
    assert not LedgerEntry.objects.filter(kind="top_up").exists()


def test_an_expired_event_never_unpays_a_paid_top_up(
    acme: Tenant,
    as_owner: APIClient,
    stripe_fake: FakeStripe,
    eager_celery: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    session_id = _top_up(as_owner, "25.00").json()["session_id"]
    paid = stripe_fake.pay(session_id)
    # An expired event for the same session after it (Stripe sends none, but events
    # carry no order): the conditional update leaves a paid top-up paid.
    stale = {**paid, "id": "evt_stale", "type": "checkout.session.expired"}
    for event in (paid, stale):
        with django_capture_on_commit_callbacks(execute=True):
            assert _deliver(event).status_code == 200
    assert TopUp.objects.get(session_id=session_id).status == "paid"
    assert _balance(acme) == SIGNUP + 25_000_000


def test_reconciliation_expires_abandoned_checkouts_so_a_paid_one_behind_them_is_credited(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe
) -> None:
    from spurcloud.billing.stripe_payments import reconcile_topups

    abandoned = [_top_up(as_owner, "10.00").json()["session_id"] for _ in range(5)]
    for session_id in abandoned:
        stripe_fake.expire(session_id)  # Stripe's 24 hours passed; no webhook reached us
    paid = _top_up(as_owner, "25.00").json()["session_id"]
    stripe_fake.pay(paid)  # its webhook was lost
    # Three sessions per run: without expiry the five abandoned ones would fill every run.
    assert reconcile_topups(older_than_s=0, batch=3) == 0
    assert reconcile_topups(older_than_s=0, batch=3) == 1
    assert reconcile_topups(older_than_s=0, batch=3) == 0
    statuses = dict(TopUp.objects.values_list("session_id", "status"))
    assert [statuses[s] for s in abandoned] == ["expired"] * 5
    assert statuses[paid] == "paid"
    assert _balance(acme) == SIGNUP + 25_000_000


def test_the_fake_expires_a_session_through_the_api_as_stripe_does(
    acme: Tenant, as_owner: APIClient, stripe_fake: FakeStripe
) -> None:
    from spurcloud.billing.stripe_payments import reconcile_topups, stripe_client

    session_id = _top_up(as_owner, "10.00").json()["session_id"]
    stripe_client().v1.checkout.sessions.expire(session_id)
    assert reconcile_topups(older_than_s=0) == 0
    assert TopUp.objects.get(session_id=session_id).status == "expired"
