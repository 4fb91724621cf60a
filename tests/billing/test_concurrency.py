"""Writers in parallel, on real PostgreSQL connections: top-ups and metering ticks
(duplicated on purpose) leave the balance the entries add up to, and each charge once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from spurcloud.billing.ledger import open_account, post_entry
from spurcloud.billing.metering import meter_job_events, meter_open_runs
from spurcloud.billing.models import BillingAccount, LedgerEntry, MeteredRun
from tests.billing.conftest import T0, Tenant, job_event

pytestmark = pytest.mark.django_db(transaction=True)


def _in_threads(work: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(work))

    def run(job: Callable[[], None]) -> None:
        try:
            barrier.wait()
            job()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(job,)) for job in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors


def test_top_ups_and_metering_in_parallel_leave_the_right_balance(
    acme: Tenant, prices: Any
) -> None:
    organization = acme.organization
    open_account(organization=organization)
    meter_job_events(
        events=[job_event(job_id, when=0, state="RUNNING", start=0) for job_id in range(1, 21)]
    )

    def top_ups() -> None:
        for _ in range(20):
            post_entry(
                organization=organization, kind=LedgerEntry.Kind.TOP_UP, amount_micro=1_000_000
            )

    def ticks() -> None:
        for minute in range(1, 11):  # two threads tick the same minutes: each charges once
            meter_open_runs(now=T0 + timedelta(minutes=minute))

    def finishes() -> None:
        meter_job_events(
            events=[
                job_event(job_id, when=600, state="COMPLETED", start=0, end=600)
                for job_id in range(1, 11)
            ]
        )

    _in_threads([top_ups, top_ups, ticks, ticks, finishes])
    charged = sum(MeteredRun.objects.values_list("charged_micro", flat=True))
    # 20 jobs × 10 minutes × 2 GPUs at 2.50 an hour, each run floored once.
    assert charged == 20 * (2 * 2_500_000 * 600 // 3600)
    account = BillingAccount.objects.get(organization=organization)
    entries = sum(
        LedgerEntry.objects.filter(organization=organization).values_list("amount_micro", flat=True)
    )
    assert account.balance_micro == entries == 10_000_000 + 40 * 1_000_000 - charged
    # The cached balance after each entry chains: no two writers read the same balance.
    chain = list(
        LedgerEntry.objects.filter(organization=organization)
        .order_by("id")
        .values_list("amount_micro", "balance_after_micro")
    )
    running = 0
    for amount, after in chain:
        running += amount
        assert after == running
