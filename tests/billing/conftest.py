"""Fixtures for billing's tests: the web app's organisations and clients
(tests/spurcloud/conftest.py), a price book, and job events at chosen times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from spurcloud.billing.models import PriceEntry, QosClass
from tests.fixtures.stripe_fake import stripe_fake  # noqa: F401 - a fixture
from tests.spurcloud.conftest import (  # noqa: F401 - fixtures, used by name
    Tenant,
    acme,
    api_client,
    as_member,
    as_outsider,
    as_owner,
    fresh_rate_limits,
    globex,
    job_dict,
    live_controller,
    make_user,
    quick_controller_retries,
)

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
H100_PRICE = 2_500_000  # 2.50 per GPU-hour


@pytest.fixture
def prices(db: None) -> list[PriceEntry]:
    since = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        PriceEntry.objects.create(
            gpu_model="h100", qos_class=QosClass.ON_DEMAND, effective_from=since,
            gpu_hour_micro=H100_PRICE,
        ),
        PriceEntry.objects.create(
            gpu_model="h100", qos_class=QosClass.SPOT, effective_from=since,
            gpu_hour_micro=1_000_000,
        ),
        PriceEntry.objects.create(
            gpu_model="", qos_class=QosClass.ON_DEMAND, effective_from=since,
            gpu_hour_micro=1_800_000,
        ),
    ]  # fmt: skip


@pytest.fixture
def billing_user(acme: Tenant) -> Any:  # noqa: F811 - the fixture, by name
    """A member of acme with the billing role."""
    from spurcloud.tenants.models import Membership
    from spurcloud.tenants.services import add_member

    user = make_user("bill")
    add_member(
        organization=acme.organization, user=user, role=Membership.Role.BILLING, by=acme.owner
    )
    return user


@pytest.fixture
def admin_user(acme: Tenant) -> Any:  # noqa: F811 - the fixture, by name
    from spurcloud.tenants.models import Membership
    from spurcloud.tenants.services import add_member

    user = make_user("ada")
    add_member(organization=acme.organization, user=user, role=Membership.Role.ADMIN, by=acme.owner)
    return user


_seq = iter(range(10_000, 10_000_000))


def at(seconds: float) -> float:
    """Epoch seconds `seconds` after T0."""
    return T0.timestamp() + seconds


def job_event(
    job_id: int = 7,
    *,
    when: float,
    state: str,
    attempt: int = 1,
    start: float | None = None,
    end: float | None = None,
    tenant: str = "acme",
    seq: int | None = None,
    **changes: Any,
) -> dict[str, Any]:
    """A controller event at `when` (seconds after T0) for a 2-GPU h100 job in `state`."""
    job = job_dict(
        job_id,
        tenant=tenant,
        user="max",
        state=state,
        attempt=attempt,
        start_time=None if start is None else at(start),
        end_time=None if end is None else at(end),
        gpu_type="h100",
        **changes,
    )
    number = next(_seq) if seq is None else seq
    return {
        "seq": number,
        "cluster": "spur",
        "kind": "changed",
        "at": at(when),
        "job": {**job, "seq": number},
    }


def repair_money(sql: str, params: list[Any]) -> None:
    """What an operator's deliberate repair of a record of money looks like: the trigger's
    switch set for its own transaction alone (here a savepoint of the test's transaction,
    which SET LOCAL would outlive: so it is switched off again)."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL spur.allow_money_edit = 'on'")
        cursor.execute(sql, params)
        cursor.execute("SET LOCAL spur.allow_money_edit = 'off'")


@pytest.fixture
def eager_celery() -> Any:
    """Tasks run in the calling thread (the webhook's fulfilment, sent on commit)."""
    from spurcloud.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield app
    app.conf.task_always_eager = before
