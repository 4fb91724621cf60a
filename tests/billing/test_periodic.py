"""Billing's periodic work happens only if beat sends it: every billing task that takes
no argument (a periodic one: `fulfil_stripe_event` takes its event) is in the beat
schedule, and `spurcloud up` runs beat; its demo price book prices what it runs."""

from __future__ import annotations

import inspect
import json
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from spurcloud.billing import tasks
from spurcloud.billing.models import PriceEntry
from spurcloud.celery import app
from spurcloud.stack import Stack


def _billing_tasks() -> dict[str, object]:
    app.loader.import_default_modules()
    return {name: task for name, task in app.tasks.items() if name.startswith("spur.billing.")}


def test_every_periodic_billing_task_is_in_the_beat_schedule() -> None:
    found = _billing_tasks()
    assert len(found) >= 9  # the module's tasks are registered under their names
    periodic = {name for name, task in found.items() if not inspect.signature(task.run).parameters}
    assert "spur.billing.fulfil_stripe_event" not in periodic
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert periodic <= scheduled, f"not scheduled: {sorted(periodic - scheduled)}"
    assert scheduled <= set(app.tasks), "a schedule entry names no task"
    assert tasks.meter_tick.name in periodic


def test_the_one_command_platform_runs_beat_with_its_schedule_in_the_state_dir(
    tmp_path: Path,
) -> None:
    processes = Stack(state_dir=tmp_path, nodes=[("sim01", "h100-8")]).celery_processes()
    assert set(processes) == {"worker", "beat"}
    beat = processes["beat"]
    assert beat[1:4] == ["-A", "spurcloud", "beat"]
    assert str(tmp_path / "celerybeat-schedule") in beat


@pytest.mark.django_db
def test_the_demo_price_book_fills_an_empty_book_once() -> None:
    out = StringIO()
    call_command("seed_prices", stdout=out)
    assert json.loads(out.getvalue()) == {"created": 6}
    prices = {(p.gpu_model, p.qos_class): p for p in PriceEntry.objects.all()}
    assert prices[("h100", "on_demand")].gpu_hour_micro == 2_500_000
    assert prices[("h100", "spot")].gpu_hour_micro == 1_000_000
    assert all(p.cpu_hour_micro and p.mem_gb_hour_micro for p in prices.values())
    again = StringIO()
    call_command("seed_prices", stdout=again)
    assert json.loads(again.getvalue()) == {"created": 0}
    assert PriceEntry.objects.count() == 6
