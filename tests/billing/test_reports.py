"""The usage reports' queries as PostgreSQL plans them."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from spurcloud.billing import reports
from spurcloud.billing.models import MeteredRun, UsageRecord
from tests.billing.conftest import T0, Tenant

pytestmark = pytest.mark.django_db

DAYS, MINUTES = 2, 600


def _estimated_groups() -> int:
    plan: Any = reports.live_query(T0, ["organization_id", "gpu_model"]).explain(format="json")
    return int(json.loads(plan)[0]["Plan"]["Plan Rows"])


def test_the_planner_knows_the_live_records_hold_a_group_per_organisation_and_day(
    acme: Tenant, globex: Tenant
) -> None:
    """Billing migration 0011's statistics: the live sums' groups (UTC day, organisation,
    GPU model) are estimated as they are, a handful, where PostgreSQL alone guesses one
    group per ten records and sorts them all (the dashboard's 1.1 s at 1.44 million)."""
    for tenant in (acme, globex):
        run = MeteredRun.objects.create(
            cluster="spur", job_id=tenant.organization.pk, attempt=1,
            organization=tenant.organization, gpu_model="h100", qos_class="on_demand",
            gpu_milli=1000, cpus=1, mem_mb=0, started_at=T0, metered_until=T0,
        )  # fmt: skip
        UsageRecord.objects.bulk_create(
            UsageRecord(
                run=run, organization=tenant.organization, gpu_model="h100",
                qos_class="on_demand", gpu_milli_seconds=60_000, amount_micro=41_666,
                period_start=T0 + timedelta(days=d, minutes=m),
                period_end=T0 + timedelta(days=d, minutes=m + 1),
            )
            for d in range(DAYS)
            for m in range(MINUTES)
        )  # fmt: skip
    groups = len(reports.live_query(T0, ["organization_id", "gpu_model"]))
    assert groups == 2 * DAYS
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_usagerecord")
        with_statistics = _estimated_groups()
        cursor.execute("DROP STATISTICS billing_usagerecord_day_groups")  # rolled back after
        cursor.execute("ANALYZE billing_usagerecord")
        without = _estimated_groups()
    assert with_statistics <= 2 * groups
    assert without >= 10 * groups
