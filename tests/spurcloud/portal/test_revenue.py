"""The staff revenue dashboard and its CSV export; the daily rollup it reads; the SVG
charts it draws."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from spurcloud.billing import reports
from spurcloud.billing.charts import Bar, stacked_bars
from spurcloud.billing.models import UsageDay, UsageRollupMark
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
    assert page.count('<svg class="chart"') == 2  # no controller: utilisation unknown
    assert "Capacity unknown" in page
    assert "<td>acme</td><td>0.03</td><td>3.000001 USD</td>" in page
    assert "<td>globex</td><td>0.02</td><td>0.50 USD</td>" in page
    assert "<td>h100</td><td>0.03</td><td>1.500001 USD</td>" in page
    assert "<td>mi300x</td><td>0.02</td><td>2.00 USD</td>" in page
    month = timezone.now().astimezone(UTC)
    assert f"<td>{month:%Y-%m}</td>" in page
    assert "total 3.500001 USD" in page  # the day chart's text alternative


def test_utilisation_against_the_clusters_gpus(
    staff: Any, sales: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spurcloud.portal import revenue_views

    monkeypatch.setattr(revenue_views, "_capacity_gpus", lambda: 1)
    page = browser(staff).get("/revenue/").content.decode()
    assert page.count('<svg class="chart"') == 3
    # Two GPU-minutes two days ago over 1 GPU x 24 h: 0.13% (floored to a basis point).
    assert "<td>0.03</td><td>0.13%</td>" in page


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
