"""Billing's cost on PostgreSQL: the metering tick, event ingestion and the dashboard.

    python bench/billing.py

Creates (and drops again) its own database next to DATABASE_URL's (default
postgres://postgres@127.0.0.1:5432/spur), migrates it, and times:

  meter_tick_s   one metering tick (`metering.meter_open_runs`, what the per-minute beat
                 task runs) over 10,000 running jobs of 100 organisations, each
                 already metered up to a minute ago; the median of 3 ticks
  events_per_s   job events metered into usage records and the ledger
                 (`metering.meter_job_events`, as the job-events task calls it): 5,000
                 jobs each started and finished, with 20% of the events delivered twice
                 and the batches shuffled, in batches of 50 (the controller coalesces
                 per batch); duplicates count as events, since the task receives them
  dashboard_ms   the staff revenue dashboard's load time (GET /revenue/) with a year
                 of usage for 1,000 organisations: bench/billing_dashboard.py says
                 what data and how it is timed

It checks as it goes that each job was charged exactly once (the expected micro-units),
then prints a table and, last, one JSON line.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ORGS = 100
RUNNING = 10_000
EVENT_JOBS = 5_000
DUPLICATES = 0.2
BATCH = 50
PRICE = 2_500_000  # 2.50 per GPU-hour
T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _database_urls() -> tuple[str, str, str]:
    """(the server's maintenance URL, the bench database's URL, its name)."""
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/spur")
    parts = urlsplit(base)
    if parts.scheme not in ("postgres", "postgresql"):
        raise SystemExit(f"bench/billing.py needs PostgreSQL; DATABASE_URL is {base!r}")
    name = f"{parts.path.lstrip('/') or 'spur'}_bench_billing"
    admin = urlunsplit(parts._replace(path="/postgres"))
    return admin, urlunsplit(parts._replace(path=f"/{name}")), name


def _recreate(admin_url: str, name: str, *, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    admin_url, url, name = _database_urls()
    _recreate(admin_url, name)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "spurcloud.settings")
    os.environ.setdefault("BILLING_LOW_BALANCE_MICRO", "0")
    # Enough credit that no organisation of the bench runs low (and logs it).
    os.environ.setdefault("BILLING_SIGNUP_CREDIT_MICRO", str(10**12))
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        tick_s = bench_tick()
        events_per_s = bench_events()
        from bench.billing_dashboard import bench_dashboard

        dashboard_ms = bench_dashboard()
        from django.db import connections

        connections.close_all()
    finally:
        _recreate(admin_url, name, drop_only=True)
    rows = [
        ("meter tick, 10,000 running jobs (s)", f"{tick_s:.3f}", "< 2"),
        ("job events metered (events/s)", f"{events_per_s:,.0f}", ">= 1,000"),
        ("admin dashboard, a year x 1,000 orgs (ms)", f"{dashboard_ms:.0f}", "< 1,000"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>10}  goal")
    for label, value, goal in rows:
        print(f"{label:<{width}}  {value:>10}  {goal}")
    print(
        json.dumps(
            {
                "bench": "billing",
                "meter_tick_s": round(tick_s, 3),
                "events_per_s": round(events_per_s, 1),
                "dashboard_ms": round(dashboard_ms, 1),
            }
        )
    )


def _organizations(prefix: str) -> list:  # type: ignore[type-arg]
    from spurcloud.billing.ledger import open_account
    from spurcloud.tenants.models import Organization

    orgs = Organization.objects.bulk_create(
        [Organization(name=f"{prefix} {i}", slug=f"{prefix}-{i}") for i in range(ORGS)]
    )
    for org in orgs:
        open_account(organization=org)
    return orgs


def _prices() -> None:
    from spurcloud.billing.models import PriceEntry, QosClass

    PriceEntry.objects.get_or_create(
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        effective_from=T0 - timedelta(days=30),
        defaults={"gpu_hour_micro": PRICE},
    )


def bench_tick() -> float:
    from spurcloud.billing.metering import meter_open_runs
    from spurcloud.billing.models import MeteredRun

    _prices()
    orgs = _organizations("tick")
    MeteredRun.objects.bulk_create(
        [
            MeteredRun(
                cluster="spur",
                job_id=1_000_000 + i,
                attempt=1,
                organization=orgs[i % ORGS],
                gpu_model="h100",
                qos_class="on_demand",
                gpu_milli=2000,
                cpus=16,
                mem_mb=0,
                started_at=T0,
                metered_until=T0,
            )
            for i in range(RUNNING)
        ],
        batch_size=2000,
    )
    times = []
    for minute in (1, 2, 3):
        started = time.perf_counter()
        charged = meter_open_runs(now=T0 + timedelta(minutes=minute))
        times.append(time.perf_counter() - started)
        assert charged == RUNNING, charged
    per_run = MeteredRun.objects.filter(job_id__gte=1_000_000).values_list(
        "charged_micro", flat=True
    )
    expected = 2 * PRICE * 180 // 3600  # three minutes on two GPUs
    assert set(per_run) == {expected}, set(per_run)
    return statistics.median(times)


def _event(job_id: int, org: str, seq: int, *, finished: bool) -> dict:  # type: ignore[type-arg]
    start = T0.timestamp() + (job_id % 600)
    end = start + 3661
    job = {
        "job_id": job_id,
        "tenant": org,
        "state": "COMPLETED" if finished else "RUNNING",
        "attempt": 1,
        "start_time": start,
        "end_time": end if finished else None,
        "gpu_type": "h100",
        "qos": "normal",
        "gpu_milli": 2000,
        "num_cpus": 16,
        "allocation": {"node01": {"gpus": [0, 1], "cpus": 16, "mem_mb": 0}},
        "seq": seq,
    }
    return {
        "seq": seq,
        "cluster": "spur",
        "kind": "changed",
        "at": end if finished else start + 1,
        "job": job,
    }


def bench_events() -> float:
    from spurcloud.billing.metering import meter_job_events
    from spurcloud.billing.models import MeteredRun

    orgs = _organizations("events")
    rng = random.Random(11)
    events = []
    for i in range(EVENT_JOBS):
        org = orgs[i % ORGS].slug
        events.append(_event(2_000_000 + i, org, 2 * i + 1, finished=False))
        events.append(_event(2_000_000 + i, org, 2 * i + 2, finished=True))
    events += rng.sample(events, int(len(events) * DUPLICATES))
    # Batches as the controller sends them, then some delivered out of order.
    events.sort(key=lambda e: e["seq"])
    batches = [events[i : i + BATCH] for i in range(0, len(events), BATCH)]
    for i in range(0, len(batches) - 1, 7):
        batches[i], batches[i + 1] = batches[i + 1], batches[i]
    started = time.perf_counter()
    for batch in batches:
        meter_job_events(events=batch)
    elapsed = time.perf_counter() - started
    charged = set(
        MeteredRun.objects.filter(job_id__gte=2_000_000).values_list("charged_micro", flat=True)
    )
    assert charged == {2 * PRICE * 3661 // 3600}, charged
    return len(events) / elapsed


if __name__ == "__main__":
    main()
