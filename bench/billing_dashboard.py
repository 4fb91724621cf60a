"""The staff revenue dashboard's load time with a year of usage for 1,000 organisations
(bench/billing.py calls `bench_dashboard` in its own database).

The data: 1,000 organisations, each with two GPU models every day of the past year,
in the daily rollup (`UsageDay`, 730,000 rows, as the hourly rollup task leaves them,
its mark at midnight); and today, not rolled up yet, one running job per organisation
metered every minute for a whole day (1,440,000 usage records: the worst case, the
rollup task a day late). Written with INSERT ... SELECT generate_series, then ANALYZE.

The cluster's capacity: an hourly sample of 1,024 GPUs for the whole year (8,760
`CapacitySample` rows, as the hourly task leaves them).

Timed: GET /revenue/ through Django's test client as a staff user (the whole view:
queries, SVG charts, template), the median of 5 after one warm-up. The controller's
live GPU count is stubbed to 1,024 GPUs: a network call is not the database's cost.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta

ORGS = 1_000
DAYS = 365
MINUTES_TODAY = 1_440


def _populate() -> None:
    from django.db import connection
    from django.utils import timezone

    from spurcloud.billing.models import (
        CapacitySample,
        MeteredRun,
        UsageDay,
        UsageRecord,
        UsageRollupMark,
    )
    from spurcloud.tenants.models import Organization

    Organization.objects.bulk_create(
        [Organization(name=f"Dash {i}", slug=f"dash-{i}") for i in range(ORGS)]
    )
    today = timezone.now().astimezone(UTC).date()
    midnight = datetime.combine(today, datetime.min.time(), tzinfo=UTC)
    org, day, run, rec = (
        Organization._meta.db_table,
        UsageDay._meta.db_table,
        MeteredRun._meta.db_table,
        UsageRecord._meta.db_table,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {day} (day, organization_id, gpu_model, qos_class,
                               gpu_milli_seconds, amount_micro)
            SELECT %s::date - d, o.id, m, 'on_demand',
                   ((o.id + d) %% 24 + 1) * 3600000, ((o.id + d) %% 24 + 1) * 2500000
            FROM {org} o, generate_series(1, %s) d, unnest(ARRAY['h100', 'mi300x']) m
            WHERE o.slug LIKE 'dash-%%'
            """,
            [today, DAYS],
        )
        cursor.execute(
            f"""
            INSERT INTO {run} (cluster, job_id, attempt, organization_id, gpu_model,
                               qos_class, gpu_milli, cpus, mem_mb, started_at,
                               metered_until, charged_micro, remainder, carried_remainder)
            SELECT 'dash', 9000000 + o.id, 0, o.id, 'h100', 'on_demand', 1000, 1, 1024,
                   %s, %s, 0, 0, 0
            FROM {org} o WHERE o.slug LIKE 'dash-%%'
            """,
            [midnight, midnight + timedelta(minutes=MINUTES_TODAY)],
        )
        cursor.execute(
            f"""
            INSERT INTO {rec} (run_id, organization_id, period_start, period_end,
                               gpu_model, qos_class, gpu_milli_seconds, amount_micro)
            SELECT r.id, r.organization_id, %s + make_interval(mins => n),
                   %s + make_interval(mins => n + 1), 'h100', 'on_demand', 60000, 41666
            FROM {run} r, generate_series(0, %s) n WHERE r.cluster = 'dash'
            """,
            [midnight, midnight, MINUTES_TODAY - 1],
        )
        cursor.execute(
            f"""
            INSERT INTO {CapacitySample._meta.db_table} (hour, gpus)
            SELECT %s - make_interval(hours => h), 1024 FROM generate_series(1, %s) h
            """,
            [midnight, DAYS * 24],
        )
        cursor.execute("ANALYZE")
    UsageRollupMark.objects.create(pk=1, until=midnight)


def bench_dashboard() -> float:
    """The median load time of the dashboard, in milliseconds."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    from spurcloud.billing import capacity

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # the test client's
    _populate()
    capacity.live_gpus = lambda: 1_024  # type: ignore[assignment]
    client = Client()
    client.force_login(User.objects.create_user("bench-staff", is_staff=True))
    response = client.get("/revenue/")
    assert response.status_code == 200, (response.status_code, response.content[:300])
    # Per month, per day, utilisation, organisations, GPU models.
    assert response.content.count(b"<svg") == 5, response.content.count(b"<svg")
    assert b"dash-" in response.content
    times = []
    for _ in range(5):
        started = time.perf_counter()
        client.get("/revenue/")
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
