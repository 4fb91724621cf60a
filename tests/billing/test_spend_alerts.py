"""Spend alerts: this month's spend above X, the balance below Y. Crossing one mails the
owners and billing members once per calendar month (a retried or repeated check sends
nothing more) and shows on the portal's billing page; owners and billing members set
and remove them, admins see them, members and outsiders neither."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.core import mail
from django.core.exceptions import PermissionDenied

from spurcloud.billing import tasks
from spurcloud.billing.errors import BillingRefused
from spurcloud.billing.ledger import open_account
from spurcloud.billing.models import SpendAlert, SpendAlertFiring
from spurcloud.billing.spend_alerts import (
    MAX_ALERTS,
    check_spend_alerts,
    create_spend_alert,
    delete_spend_alert,
)
from tests.billing.conftest import Tenant
from tests.spurcloud.portal.conftest import browser
from tests.spurcloud.portal.test_billing_pages import usage

pytestmark = pytest.mark.django_db
MARCH, APRIL = datetime(2026, 3, 10, tzinfo=UTC), datetime(2026, 4, 2, tzinfo=UTC)


def _people(acme: Tenant, admin_user: Any, billing_user: Any, globex: Tenant) -> dict[str, Any]:
    return {
        "owner": acme.owner,
        "admin": admin_user,
        "billing": billing_user,
        "member": acme.member,
        "outsider": globex.owner,
    }


def _check(capture: Any, now: datetime) -> int:
    with capture(execute=True):
        return check_spend_alerts(now=now)


def test_a_spend_alert_mails_the_payers_once_a_month(
    acme: Tenant, billing_user: Any, admin_user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    open_account(organization=acme.organization)
    create_spend_alert(
        organization=acme.organization,
        user=acme.owner,
        kind="monthly_spend_above",
        threshold_micro=5_000_000,
    )
    usage(acme.organization, MARCH, micro=4_000_000)
    assert _check(django_capture_on_commit_callbacks, MARCH.replace(hour=12)) == 0
    usage(acme.organization, MARCH.replace(day=11), micro=2_000_000)  # 6.00 this month
    assert _check(django_capture_on_commit_callbacks, MARCH.replace(day=12)) == 1
    (message,) = mail.outbox
    assert sorted(message.to) == ["bill@example.com", "olivia@example.com"]  # not the admin
    assert "spend this month is 6.00 USD" in message.subject
    assert "This month's spend above 5.00 USD" in message.body
    # Again, and through the beat task: nothing more this month.
    assert _check(django_capture_on_commit_callbacks, MARCH.replace(day=20)) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.check_spend_alerts.apply().get() == 0  # now: no spend this month
    assert len(mail.outbox) == 1
    # April: a new month, crossed again, mailed again.
    usage(acme.organization, APRIL, micro=5_500_000)
    assert _check(django_capture_on_commit_callbacks, APRIL.replace(day=3)) == 1
    assert len(mail.outbox) == 2
    assert SpendAlertFiring.objects.count() == 2


def test_a_balance_alert_fires_below_its_threshold_only(
    acme: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    open_account(organization=acme.organization)  # 10.00 of sign-up credit
    create_spend_alert(
        organization=acme.organization,
        user=acme.owner,
        kind="balance_below",
        threshold_micro=10_000_000,
    )
    assert _check(django_capture_on_commit_callbacks, MARCH) == 0
    alert = create_spend_alert(
        organization=acme.organization,
        user=acme.owner,
        kind="balance_below",
        threshold_micro=10_000_001,
    )
    assert _check(django_capture_on_commit_callbacks, MARCH) == 1
    assert SpendAlertFiring.objects.get().alert == alert
    assert "balance is 10.00 USD" in mail.outbox[0].subject


@pytest.mark.parametrize("who", ["owner", "admin", "billing", "member", "outsider"])
def test_only_owners_and_billing_members_set_and_remove_alerts(
    who: str, acme: Tenant, admin_user: Any, billing_user: Any, globex: Tenant
) -> None:
    user = _people(acme, admin_user, billing_user, globex)[who]
    org = acme.organization
    if who in ("owner", "billing"):
        alert = create_spend_alert(
            organization=org, user=user, kind="balance_below", threshold_micro=1
        )
        delete_spend_alert(organization=org, user=user, alert_id=alert.pk)
        assert not SpendAlert.objects.exists()
    else:
        with pytest.raises(PermissionDenied):
            create_spend_alert(organization=org, user=user, kind="balance_below", threshold_micro=1)


@pytest.mark.parametrize(
    "kind,threshold,message",
    [
        ("sometimes", 1, "kind must be one of"),
        ("monthly_spend_above", 0, "above zero"),
        ("balance_below", 10**16, "too large"),
    ],
)
def test_a_bad_alert_is_refused_with_a_message(
    acme: Tenant, kind: str, threshold: int, message: str
) -> None:
    with pytest.raises(BillingRefused, match=message):
        create_spend_alert(
            organization=acme.organization, user=acme.owner, kind=kind, threshold_micro=threshold
        )


def test_an_alert_is_set_once_and_at_most_so_many(acme: Tenant) -> None:
    org, owner = acme.organization, acme.owner
    create_spend_alert(organization=org, user=owner, kind="balance_below", threshold_micro=0)
    with pytest.raises(BillingRefused, match="already set"):
        create_spend_alert(organization=org, user=owner, kind="balance_below", threshold_micro=0)
    for i in range(1, MAX_ALERTS):
        create_spend_alert(organization=org, user=owner, kind="balance_below", threshold_micro=i)
    with pytest.raises(BillingRefused, match=f"at most {MAX_ALERTS}"):
        create_spend_alert(organization=org, user=owner, kind="balance_below", threshold_micro=-1)


@pytest.mark.parametrize("who", ["owner", "admin", "billing", "member", "outsider"])
def test_the_billing_page_shows_and_manages_alerts_by_role(
    who: str,
    acme: Tenant,
    admin_user: Any,
    billing_user: Any,
    globex: Tenant,
    django_capture_on_commit_callbacks: Any,
) -> None:
    open_account(organization=acme.organization)
    alert = create_spend_alert(
        organization=acme.organization,
        user=acme.owner,
        kind="balance_below",
        threshold_micro=20_000_000,
    )
    _check(django_capture_on_commit_callbacks, datetime.now(UTC))
    client = browser(_people(acme, admin_user, billing_user, globex)[who])
    page = client.get("/billing/").content.decode()
    shown = "Balance below 20.00 USD" in page and "Crossed</strong> on" in page
    assert shown == (who in ("owner", "admin", "billing"))
    # The outsider owns globex: its own page, with its own (empty) alerts and the form.
    assert ('action="/billing/alerts"' in page) == (who in ("owner", "billing", "outsider"))
    added = client.post("/billing/alerts", {"kind": "monthly_spend_above", "threshold": "250"})
    assert added.status_code == 302
    mine = SpendAlert.objects.filter(threshold_micro=250_000_000)
    if who in ("owner", "billing"):
        assert mine.get().organization == acme.organization
        assert "Spend alert added" in client.get("/billing/").content.decode()
    elif who == "outsider":  # their own organisation's alert, never acme's
        assert mine.get().organization == globex.organization
    else:
        assert not mine.exists()
    removed = client.post(f"/billing/alerts/{alert.pk}/delete")
    assert removed.status_code == (404 if who == "outsider" else 302)
    assert SpendAlert.objects.filter(pk=alert.pk).exists() == (who not in ("owner", "billing"))


def test_a_bad_threshold_in_the_form_says_so(acme: Tenant) -> None:
    client = browser(acme.owner)
    response = client.post("/billing/alerts", {"kind": "balance_below", "threshold": "lots"})
    assert "Enter a threshold" in client.get(response["Location"]).content.decode()
    assert not SpendAlert.objects.exists()
