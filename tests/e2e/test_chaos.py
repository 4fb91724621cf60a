"""A short chaos run (bench/chaos.py): three controllers, two workers and three agents,
faults in each kind of process while jobs run; nothing is lost, failed falsely,
double-booked or stuck, and every job ends once."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def load_chaos():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_chaos", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_chaos"] = module
    spec.loader.exec_module(module)
    return module


def test_a_short_chaos_run_loses_nothing_and_fails_nothing_falsely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chaos = load_chaos()
    # This seed's eight faults kill and pause each kind of process: a worker, agents, a
    # controller (kill -9; SIGSTOP past the node timeout).
    monkeypatch.setenv("CHAOS_SEED", "32")
    figures = chaos.run(jobs=60, faults=8)
    public = {k: v for k, v in figures.items() if not k.startswith("_")}
    assert public == {
        "acknowledged": 60,
        "terminal_once": 60,
        "lost": 0,
        "false_failures": 0,
        "double_booked": 0,
        "stuck": 0,
    }, figures
