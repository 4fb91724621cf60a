"""The staff revenue dashboard and its CSV export; the daily rollup it reads; the SVG
charts it draws."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from spurcloud.billing import reports
from spurcloud.billing.charts import PALETTE, Bar, horizontal_bars, nice_ticks, stacked_bars
from spurcloud.billing.models import CapacitySample, UsageDay, UsageRollupMark
from spurcloud.billing.money import format_compact, format_rounded
from tests.spurcloud.conftest import Tenant, make_user
from tests.spurcloud.portal.conftest import EVERYONE, browser
from tests.spurcloud.portal.test_billing_pages import usage


@pytest.fixture
def staff(db: None) -> Any:
    return make_user("sam", staff=True)


@pytest.fixture
def sales(acme: Tenant, globex: Tenant) -> None:
    now = timezone.now()
    usage(acme.organization, now - timedelta(minutes=3), micro=1_000_001)
    usage(acme.organization, now - timedelta(days=2), micro=2_000_000, model="mi300x")
    usage(globex.organization, now - timedelta(days=2, minutes=1), micro=500_000)


@pytest.mark.parametrize("path", ["/revenue/", "/revenue.csv"])
@pytest.mark.parametrize("who", EVERYONE)
def test_only_staff_see_revenue(path: str, who: str, people: dict[str, Any]) -> None:
    assert browser(people[who]).get(path).status_code == 403


@pytest.mark.parametrize("path", ["/revenue/", "/revenue.csv"])
def test_nobody_signed_in_is_sent_to_sign_in(path: str, db: None) -> None:
    response = browser(None).get(path)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("rolled", [False, True])
def test_staff_see_revenue_by_day_month_organisation_and_model(
    rolled: bool, staff: Any, sales: None
) -> None:
    if rolled:  # the same figures, whether past days come from the rollup or live
        # Two days ago: acme's mi300x and globex's h100; today's only if before the hour.
        rows = reports.roll_up_recent(days=3)
        assert rows in (2, 3) and reports.roll_up_recent(days=3) == rows  # idempotent
        assert UsageDay.objects.count() == rows
    response = browser(staff).get("/revenue/")
    assert response.status_code == 200
    page = response.content.decode()
    # Per month, per day, organisations, GPU models; no samples and no controller: no
    # utilisation.
    assert page.count('<svg class="chart"') == 4
    assert "Capacity unknown" in page
    assert "<title>Revenue by organisation, top 20, last 90 days</title>" in page
    assert "<title>Revenue by GPU model, last 90 days</title>" in page
    assert "2 bars; total 3.50 USD; highest 3.00 USD, acme." in page  # to the cent
    assert "<td>acme</td><td>0.03</td><td>3.000001 USD</td>" in page
    assert "<td>globex</td><td>0.02</td><td>0.50 USD</td>" in page
    assert "<td>h100</td><td>0.03</td><td>1.500001 USD</td>" in page
    assert "<td>mi300x</td><td>0.02</td><td>2.00 USD</td>" in page
    month = timezone.now().astimezone(UTC)
    assert f"<td>{month:%Y-%m}</td>" in page
    assert "total 3.500001 USD" in page  # the day chart's text alternative


def test_utilisation_is_over_each_days_own_capacity(staff: Any, sales: None) -> None:
    """Two days ago the cluster had 1 GPU (two hourly samples), today 2: each day is
    divided by its own; yesterday, never sampled, is unknown."""
    now = timezone.now().astimezone(UTC)
    two_days_ago = (now - timedelta(days=2)).replace(hour=5, minute=0, second=0, microsecond=0)
    for hour in (two_days_ago, two_days_ago + timedelta(hours=1)):
        CapacitySample.objects.create(hour=hour, gpus=1)
    CapacitySample.objects.create(hour=now.replace(minute=0, second=0, microsecond=0), gpus=2)
    page = browser(staff).get("/revenue/").content.decode()
    assert page.count('<svg class="chart"') == 5
    # Two GPU-minutes over 1 GPU x 24 h: 0.13% (floored to a basis point); today one
    # GPU-minute over 2 GPUs x 24 h: 0.03%.
    assert "<td>0.03</td><td>0.13%</td>" in page
    assert "<td>0.02</td><td>0.03%</td>" in page
    yesterday = f"{now - timedelta(days=1):%m-%d}"
    assert f"<td>{yesterday}</td><td>0.00 USD</td><td>0.00</td><td>unknown</td>" in page
    assert "2 of 90 days sampled" in page


@pytest.mark.django_db
def test_the_hourly_sample_counts_the_gpus_of_nodes_that_can_run_work(
    live_controller: Any,
) -> None:
    from spurcloud.billing.capacity import count_gpus, record_capacity

    at = datetime(2026, 5, 20, 10, 30, tzinfo=UTC)
    assert record_capacity(now=at) == 1  # the live controller's node01, one H100
    assert record_capacity(now=at + timedelta(minutes=10)) == 1  # the same hour: one row
    assert list(CapacitySample.objects.values_list("hour", "gpus")) == [
        (datetime(2026, 5, 20, 10, tzinfo=UTC), 1)
    ]
    nodes = [{"state": "idle", "gpus": [{}, {}]}, {"state": "down", "gpus": [{}]}]
    assert count_gpus(nodes) == 2


def test_the_csv_export_has_a_row_per_day_organisation_and_model(staff: Any, sales: None) -> None:
    response = browser(staff).get("/revenue.csv")
    assert response["Content-Type"].startswith("text/csv")
    lines = response.content.decode().strip().splitlines()
    assert lines[0] == "day,organization,gpu_model,gpu_hours,revenue,currency"
    assert len(lines) == 4
    assert any(line.endswith(",acme,h100,0.02,1.000001,usd") for line in lines)


def test_the_rollup_holds_records_before_its_mark_and_the_rest_is_live(
    acme: Tenant, staff: Any
) -> None:
    now = datetime(2026, 5, 20, 10, 30, tzinfo=UTC)
    usage(acme.organization, now - timedelta(days=1), micro=7)
    usage(acme.organization, now - timedelta(minutes=40), micro=5)  # 09:50: before the hour
    usage(acme.organization, now - timedelta(minutes=20), micro=3)  # 10:10: after it
    assert reports.roll_up_recent(now=now) == 2
    assert UsageRollupMark.objects.get().until == datetime(2026, 5, 20, 10, tzinfo=UTC)
    rolled = {(r.day.day, r.amount_micro) for r in UsageDay.objects.all()}
    assert rolled == {(19, 7), (20, 5)}
    rows = reports.daily(since=date(2026, 5, 18), by=[])
    assert sum(r["amount"] for r in rows) == 15  # each record counted once
    usage(acme.organization, now - timedelta(days=1, minutes=1), micro=100)  # a late record
    reports.roll_up_recent(now=now)
    assert sum(r["amount"] for r in reports.daily(since=date(2026, 5, 18), by=[])) == 115


def test_charts_escape_their_text_and_describe_themselves() -> None:
    svg = str(
        stacked_bars(
            [Bar(label="<b>", values={"<script>": 3}), Bar(label="d2", values={})],
            title="T & <x>",
            fmt=str,
        )
    )
    assert "<script>" not in svg and "<b>" not in svg and "&lt;script&gt;" in svg
    assert "<title>T &amp; &lt;x&gt;</title>" in svg
    assert "2 bars from &lt;b&gt; to d2; total 3; highest 3 on &lt;b&gt;" in svg
    assert str(stacked_bars([], title="e", fmt=str)).count("No data") == 1


def test_the_value_axis_has_round_ticks_with_grid_lines() -> None:
    assert nice_ticks(27_000_000) == [0, 10_000_000, 20_000_000, 30_000_000]
    assert nice_ticks(3_500) == [0, 1_000, 2_000, 3_000, 4_000]
    assert nice_ticks(7) == [0, 2, 4, 6, 8]
    assert nice_ticks(0) == [0, 1]
    # Axis labels are short; a chart's own labels round to the cent.
    assert format_compact(400_000_000_000, "usd") == "400k USD"
    assert format_compact(1_500_000_000_000, "usd") == "1.5M USD"
    assert format_compact(2_500_000, "usd") == "2.5 USD" and format_compact(0) == "0"
    assert format_rounded(49_307_515_512, "usd") == "49,307.52 USD"
    from spurcloud.portal.revenue_views import _axis_percent

    assert [_axis_percent(bp) for bp in (0, 2000, 250, 10_000)] == ["0%", "20%", "2.5%", "100%"]
    svg = str(stacked_bars([Bar(label="d", values={"a": 27})], title="t", fmt=str))
    for tick in ("0", "10", "20", "30"):
        assert f'text-anchor="end" font-size="12">{tick}</text>' in svg


def test_twelve_series_never_share_a_colour_and_the_legend_holds_them_all() -> None:
    models = [f"model-{i:02d}" for i in range(12)]
    bars = [
        Bar(label=f"d{d}", values={m: (i + 1) * 10 for i, m in enumerate(models)}) for d in range(3)
    ]
    svg = str(stacked_bars(bars, title="t", fmt=str))
    # The nine largest keep their own colours; the three smallest are one "3 more".
    for model in models[3:]:
        assert f">{model}</text>" in svg
    assert ">3 more</text>" in svg and ">model-00</text>" not in svg
    fills = {colour for colour in PALETTE if f'fill="{colour}"' in svg}
    assert fills == set(PALETTE)
    assert all(f"{model}," in svg or f"{model}." in svg for model in models)  # described
    # The legend wraps: its rows make the chart taller than one row of it would.
    height = float(svg.split('viewBox="0 0 720 ')[1].split('"')[0])
    assert height > 260 + 18


def test_the_horizontal_chart_labels_each_bar_with_its_value() -> None:
    svg = str(horizontal_bars([("acme", 3_000), ("<globex>", 500)], title="Orgs", fmt=str))
    assert "<title>Orgs</title>" in svg and "&lt;globex&gt;" in svg and "<globex>" not in svg
    assert svg.count("<rect") == 2 and ">3000</text>" in svg and ">500</text>" in svg
    assert "2 bars; total 3500; highest 3000, acme." in svg
