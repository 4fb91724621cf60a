"""The staff revenue dashboard: revenue by day and by month, usage per organisation and
per GPU model, utilisation (allocated GPU-hours over capacity) per day, as server-side
SVG charts with tables beside them; and the same daily figures as CSV.

Sums come from `spurcloud.billing.reports` (a daily rollup plus today live), so a page
load sums a few thousand rows, not a year of per-minute usage records. Capacity is the
cluster's GPUs now (the controller's node list) times 24 hours: a day on which the
cluster was smaller reads as less utilised than it was."""

from __future__ import annotations

import csv
from datetime import UTC, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone

from scheduler.rpc.errors import RpcError
from spurcloud.billing import reports
from spurcloud.billing.charts import Bar, stacked_bars
from spurcloud.billing.money import format_amount
from spurcloud.jobs.selectors import cluster_nodes
from spurcloud.portal.membership import AuthenticatedHttpRequest
from spurcloud.tenants.models import Organization

DAYS = 90
TOP_ORGANIZATIONS = 20


def _money(micro: int) -> str:
    return format_amount(micro, settings.BILLING_CURRENCY)


def _require_staff(request: AuthenticatedHttpRequest) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("The revenue dashboard is for the site's staff.")


def _capacity_gpus() -> int | None:
    try:
        return sum(len(node.get("gpus") or ()) for node in cluster_nodes(operator=True))
    except RpcError:
        return None


@login_required
def revenue(request: AuthenticatedHttpRequest) -> HttpResponse:
    _require_staff(request)
    today = timezone.now().astimezone(UTC).date()
    since = today - timedelta(days=DAYS - 1)
    usage = reports.window(since=since)
    rows = usage.by_day_model
    by_day = reports.bars_by_day(rows, since=since, until=today, key="gpu_model", value="amount")
    by_month = reports.revenue_by_month(recent=usage)
    gpu_days = reports.bars_by_day(rows, since=since, until=today, key="", value="gpu_ms")
    capacity = _capacity_gpus()
    # Utilisation in basis points of the day's capacity (GPUs x 24 h), exact integers.
    day_capacity = (capacity or 0) * 24 * reports.GPU_MS_PER_HOUR
    utilisation = (
        [
            Bar(label=b.label, values={"allocated": b.total * 10_000 // day_capacity})
            for b in gpu_days
        ]
        if day_capacity
        else []
    )
    per_org = reports.totals_by(usage.by_organization, "organization_id")[:TOP_ORGANIZATIONS]
    names = dict(
        Organization.objects.filter(pk__in=[o for o, _, _ in per_org]).values_list("pk", "slug")
    )
    context = {
        "days": DAYS,
        "capacity": capacity,
        "day_chart": stacked_bars(by_day, title=f"Revenue per day, last {DAYS} days", fmt=_money),
        "month_chart": stacked_bars(by_month, title="Revenue per month", fmt=_money),
        "utilisation_chart": stacked_bars(
            utilisation, title=f"GPU utilisation per day, last {DAYS} days", fmt=_percent
        )
        if utilisation
        else None,
        "months": [{"label": b.label, "amount": _money(b.total)} for b in by_month],
        "day_rows": [
            {
                "label": d.label,
                "amount": _money(d.total),
                "gpu_hours": _hours(g.total),
                "utilisation": _percent(u.total) if u else "—",
            }
            for d, g, u in zip(by_day, gpu_days, _or_nones(utilisation, len(by_day)), strict=True)
        ],
        "organizations": [
            {"slug": names.get(o, o), "amount": _money(a), "gpu_hours": _hours(g)}
            for o, a, g in per_org
        ],
        "models": [
            {"model": m or "other", "amount": _money(a), "gpu_hours": _hours(g)}
            for m, a, g in reports.totals_by(rows, "gpu_model")
        ],
    }
    return render(request, "portal/revenue.html", context)


@login_required
def revenue_csv(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Day, organisation, GPU model: GPU-hours and revenue, the dashboard's period."""
    _require_staff(request)
    today = timezone.now().astimezone(UTC).date()
    rows = reports.daily(
        since=today - timedelta(days=DAYS - 1), by=["organization__slug", "gpu_model"]
    )
    rows.sort(key=lambda r: (r["day"], r["organization__slug"], r["gpu_model"]))
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="revenue-{today:%Y%m%d}.csv"'
    writer = csv.writer(response)
    writer.writerow(["day", "organization", "gpu_model", "gpu_hours", "revenue", "currency"])
    for row in rows:
        writer.writerow(
            [
                row["day"].isoformat(),
                row["organization__slug"],
                row["gpu_model"],
                _hours(int(row["gpu_ms"] or 0)),
                format_amount(int(row["amount"] or 0)),
                settings.BILLING_CURRENCY,
            ]
        )
    return response


def _or_nones(bars: list[Bar], n: int) -> list[Bar | None]:
    return list(bars) if bars else [None] * n


def _hours(gpu_milli_seconds: int) -> str:
    return f"{Decimal(gpu_milli_seconds) / reports.GPU_MS_PER_HOUR:.2f}"


def _percent(basis_points: int) -> str:
    return f"{Decimal(basis_points) / 100:.2f}%"
