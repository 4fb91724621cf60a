"""Usage and revenue summed by day, month, organisation and GPU model: the portal's
usage chart and the staff revenue dashboard.

Usage up to a mark (the start of the hour of the last rollup run) comes from the daily
rollup (`UsageDay`, one row per day, organisation, GPU model and QoS class, rebuilt
whole from the usage records by `roll_up_recent`, so running it twice changes nothing);
records from the mark on are summed live (GROUP BY in the database). A correction to a
day already rolled up shows once the hourly task has rebuilt that day (the last two days
and today are rebuilt every run). A record counts on the UTC day it starts (the
meter's periods are a minute long). Revenue is what usage was charged, exact micro-units.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from spurcloud.billing.charts import Bar
from spurcloud.billing.models import UsageDay, UsageRecord, UsageRollupMark
from spurcloud.tenants.models import Organization

GPU_MS_PER_HOUR = 3_600_000  # milli-GPU-seconds in one GPU-hour


def _start(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def _roll_up_day(day: date, *, until: datetime) -> int:
    """Rebuilds one UTC day's rollup from its records that start before `until`."""
    UsageDay.objects.filter(day=day).delete()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {UsageDay._meta.db_table}
                (day, organization_id, gpu_model, qos_class, gpu_milli_seconds, amount_micro)
            SELECT %s, organization_id, gpu_model, qos_class,
                   SUM(gpu_milli_seconds), SUM(amount_micro)
            FROM {UsageRecord._meta.db_table}
            WHERE period_start >= %s AND period_start < %s
            GROUP BY organization_id, gpu_model, qos_class
            """,
            [day, _start(day), min(_start(day + timedelta(days=1)), until)],
        )
        return int(cursor.rowcount)


def roll_up_recent(*, days: int = 2, now: datetime | None = None) -> int:
    """Rolls usage up to the start of this hour: today so far, and again the `days`
    before it (a late event may have corrected them) and any day since the last run;
    then moves the mark, in the same transaction. Returns the rows written."""
    until = (now or timezone.now()).astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    first = until.date() - timedelta(days=days)
    with transaction.atomic():
        mark = UsageRollupMark.objects.select_for_update().filter(pk=1).first()
        if mark is not None:
            first = min(first, mark.until.astimezone(UTC).date())
        rows = 0
        day = first
        while day <= until.date():
            rows += _roll_up_day(day, until=until)
            day += timedelta(days=1)
        UsageRollupMark.objects.update_or_create(pk=1, defaults={"until": until})
    return rows


def _live_since(since: date) -> datetime:
    """Where live summing starts: the mark, or `since` when that is later."""
    mark = UsageRollupMark.objects.filter(pk=1).values_list("until", flat=True).first()
    return max(_start(since), mark) if mark is not None else _start(since)


def live_query(
    live_since: datetime, by: list[str], organization: Organization | None = None
) -> QuerySet[UsageRecord, dict[str, Any]]:
    """The live records' sums per UTC day and `by` (of one organisation's, or all): the
    group PostgreSQL's extended statistics describe (billing migration 0011), so that
    it plans a hash aggregate."""
    sums: dict[str, Any] = {"gpu_ms": Sum("gpu_milli_seconds"), "amount": Sum("amount_micro")}
    records = UsageRecord.objects.filter(period_start__gte=live_since)
    if organization is not None:
        records = records.filter(organization=organization)
    rows: QuerySet[UsageRecord, dict[str, Any]] = (
        records.annotate(day=TruncDate("period_start", tzinfo=UTC))
        .values("day", *by)
        .annotate(**sums)
        .order_by()
    )
    return rows


def _live(live_since: datetime, by: list[str]) -> list[dict[str, Any]]:
    return [dict(row) for row in live_query(live_since, by)]


def daily(
    *, since: date, by: Iterable[str], organization: Organization | None = None
) -> list[dict[str, Any]]:
    """Rows of day, the `by` fields (gpu_model, qos_class, organization_id), gpu_ms and
    amount, from `since` to today (a day may have a rolled-up row and a live one)."""
    fields = list(by)
    live_since = _live_since(since)
    rolled = UsageDay.objects.filter(day__gte=since)
    if organization is not None:
        rolled = rolled.filter(organization=organization)
    sums: dict[str, Any] = {"gpu_ms": Sum("gpu_milli_seconds"), "amount": Sum("amount_micro")}
    rows = [dict(row) for row in rolled.values("day", *fields).annotate(**sums).order_by()]
    return rows + [dict(row) for row in live_query(live_since, fields, organization)]


def bars_by_day(
    rows: list[dict[str, Any]], *, since: date, until: date, key: str, value: str
) -> list[Bar]:
    """One bar per day from `since` to `until` (empty days too), stacked by `key`."""
    per_day: dict[date, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        per_day[row["day"]][str(row[key]) if key else "all"] += int(row[value] or 0)
    days = (until - since).days + 1
    return [
        Bar(label=f"{d:%m-%d}", values=dict(per_day.get(d, {})))
        for d in (since + timedelta(days=n) for n in range(days))
    ]


@dataclass
class Window:
    """Every organisation's usage from `since` to today, summed in the database: per day
    and GPU model, and per organisation (one scan of the rollup each, one of the live
    records since the mark)."""

    since: date
    live_since: datetime
    live: list[dict[str, Any]]
    by_day_model: list[dict[str, Any]]
    by_organization: list[dict[str, Any]]


def window(*, since: date) -> Window:
    live_since = _live_since(since)
    rolled = UsageDay.objects.filter(day__gte=since)
    sums: dict[str, Any] = {"gpu_ms": Sum("gpu_milli_seconds"), "amount": Sum("amount_micro")}
    by_day_model = [
        dict(row) for row in rolled.values("day", "gpu_model").annotate(**sums).order_by()
    ]
    per_org: dict[Any, dict[str, Any]] = {
        row["organization_id"]: dict(row)
        for row in rolled.values("organization_id").annotate(**sums).order_by()
    }
    live = _live(live_since, ["organization_id", "gpu_model"])
    for row in live:
        org = per_org.setdefault(
            row["organization_id"],
            {"organization_id": row["organization_id"], "gpu_ms": 0, "amount": 0},
        )
        org["gpu_ms"] = int(org["gpu_ms"] or 0) + int(row["gpu_ms"] or 0)
        org["amount"] = int(org["amount"] or 0) + int(row["amount"] or 0)
    return Window(
        since=since,
        live_since=live_since,
        live=live,
        by_day_model=by_day_model + live,
        by_organization=list(per_org.values()),
    )


def revenue_by_month(*, months: int = 12, recent: Window | None = None) -> list[Bar]:
    """Revenue per calendar month (UTC), the last `months` ones. The live part of
    `recent`, when it is the same, is not summed again."""
    today = timezone.now().astimezone(UTC).date()
    first = date(today.year, today.month, 1)
    for _ in range(months - 1):
        first = date(first.year - (first.month == 1), (first.month - 2) % 12 + 1, 1)
    totals: dict[tuple[int, int], int] = defaultdict(int)
    # Summed per day and the days added up per month here: grouping on the day itself
    # spares the database a truncation per row (a year of rollup rows: a quarter less).
    for row in (
        UsageDay.objects.filter(day__gte=first)
        .values("day")
        .annotate(amount=Sum("amount_micro"))
        .order_by()
    ):
        totals[(row["day"].year, row["day"].month)] += int(row["amount"] or 0)
    live_since = _live_since(first)
    same = recent is not None and recent.live_since == live_since
    for live in recent.live if recent is not None and same else _live(live_since, []):
        totals[(live["day"].year, live["day"].month)] += int(live["amount"] or 0)
    bars, month = [], first
    for _ in range(months):
        revenue = totals[(month.year, month.month)]
        bars.append(Bar(label=f"{month:%Y-%m}", values={"revenue": revenue}))
        month = date(month.year + (month.month == 12), month.month % 12 + 1, 1)
    return bars


def totals_by(rows: list[dict[str, Any]], key: str) -> list[tuple[Any, int, int]]:
    """(key, amount, gpu_ms) per value of `key`, the largest amount first."""
    amount: dict[Any, int] = defaultdict(int)
    gpu_ms: dict[Any, int] = defaultdict(int)
    for row in rows:
        amount[row[key]] += int(row["amount"] or 0)
        gpu_ms[row[key]] += int(row["gpu_ms"] or 0)
    return sorted(((k, amount[k], gpu_ms[k]) for k in amount), key=lambda t: (-t[1], str(t[0])))
