"""The staff revenue dashboard: revenue by day and by month, usage per organisation and
per GPU model, utilisation (allocated GPU-hours over capacity) per day, as server-side
SVG charts with tables beside them; and the same daily figures as CSV.

Sums come from `spurcloud.billing.reports` (a daily rollup plus today live), so a page
load sums a few thousand rows, not a year of per-minute usage records. A day's capacity
is its own (`billing.capacity`: hourly samples of the cluster's GPUs, their mean times
24 h; today's includes the page's own reading): a day on which the cluster was smaller
reads as it was. A day without samples has no known utilisation, and says so."""

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

from spurcloud.billing import capacity, reports
from spurcloud.billing.charts import Bar, horizontal_bars, stacked_bars
from spurcloud.billing.money import format_amount, format_compact, format_rounded
from spurcloud.portal.membership import AuthenticatedHttpRequest
from spurcloud.tenants.models import Organization

DAYS = 90
TOP_ORGANIZATIONS = 20


def _money(micro: int) -> str:
    return format_amount(micro, settings.BILLING_CURRENCY)


def _axis_money(micro: int) -> str:
    return format_compact(micro, settings.BILLING_CURRENCY)


def _round_money(micro: int) -> str:
    return format_rounded(micro, settings.BILLING_CURRENCY)


def _require_staff(request: AuthenticatedHttpRequest) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("The revenue dashboard is for the site's staff.")


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
    live = capacity.live_gpus()
    day_capacity = capacity.daily_capacity(since=since, until=today, today_live=live)
    # Utilisation in basis points of each day's own capacity, exact integers; None where
    # the day's capacity is unknown.
    days = [since + timedelta(days=n) for n in range(DAYS)]
    utilisation = [
        b.total * 10_000 // day_capacity[d] if day_capacity.get(d) else None
        for d, b in zip(days, gpu_days, strict=True)
    ]
    known = [
        Bar(label=b.label, values={"allocated": u or 0})
        for b, u in zip(gpu_days, utilisation, strict=True)
    ]
    per_org = reports.totals_by(usage.by_organization, "organization_id")[:TOP_ORGANIZATIONS]
    names = dict(
        Organization.objects.filter(pk__in=[o for o, _, _ in per_org]).values_list("pk", "slug")
    )
    organizations = [(str(names.get(o, o)), a, g) for o, a, g in per_org]
    models = [(m or "other", a, g) for m, a, g in reports.totals_by(rows, "gpu_model")]
    context = {
        "days": DAYS,
        "capacity": live,
        "capacity_days": sum(1 for u in utilisation if u is not None),
        "day_chart": stacked_bars(
            by_day, title=f"Revenue per day, last {DAYS} days", fmt=_money, axis_fmt=_axis_money
        ),
        "month_chart": stacked_bars(
            by_month, title="Revenue per month", fmt=_money, axis_fmt=_axis_money
        ),
        "utilisation_chart": stacked_bars(
            known,
            title=f"GPU utilisation per day, last {DAYS} days",
            fmt=_percent,
            axis_fmt=_axis_percent,
        )
        if any(u is not None for u in utilisation)
        else None,
        "organization_chart": horizontal_bars(
            [(slug, a) for slug, a, _ in organizations],
            title=f"Revenue by organisation, top {TOP_ORGANIZATIONS}, last {DAYS} days",
            fmt=_round_money,
        )
        if organizations
        else None,
        "model_chart": horizontal_bars(
            [(m, a) for m, a, _ in models],
            title=f"Revenue by GPU model, last {DAYS} days",
            fmt=_round_money,
        )
        if models
        else None,
        "months": [{"label": b.label, "amount": _money(b.total)} for b in by_month],
        "day_rows": [
            {
                "label": d.label,
                "amount": _money(d.total),
                "gpu_hours": _hours(g.total),
                "utilisation": _percent(u) if u is not None else "unknown",
            }
            for d, g, u in zip(by_day, gpu_days, utilisation, strict=True)
        ],
        "organizations": [
            {"slug": slug, "amount": _money(a), "gpu_hours": _hours(g)}
            for slug, a, g in organizations
        ],
        "models": [{"model": m, "amount": _money(a), "gpu_hours": _hours(g)} for m, a, g in models],
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


def _hours(gpu_milli_seconds: int) -> str:
    return f"{Decimal(gpu_milli_seconds) / reports.GPU_MS_PER_HOUR:.2f}"


def _percent(basis_points: int) -> str:
    return f"{Decimal(basis_points) / 100:.2f}%"


def _axis_percent(basis_points: int) -> str:
    return f"{(Decimal(basis_points) / 100).normalize():f}%"
