"""The timed replay of bench/placement_quality.py: its pure arrival helpers and its
queue on a one-node cluster (no trace needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import JobSpec
from scheduler.core.jobs import Job
from scheduler.core.placement import task_mix
from scheduler.core.resources import GpuDevice, NodeSpec
from scheduler.core.state import ClusterState

_PATH = Path(__file__).resolve().parents[2] / "bench" / "placement_quality.py"
_SPEC = importlib.util.spec_from_file_location("placement_quality_bench", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
pq = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = pq
_SPEC.loader.exec_module(pq)


def test_clip_gaps_keeps_order_and_clips_long_gaps() -> None:
    times = [5.0, 15.0, 16.0, 1005.0, 1006.0]  # gaps 10, 1, 989, 1
    assert pq.clip_gaps(times, 0.75) == [0.0, 10.0, 11.0, 21.0, 22.0]
    assert pq.clip_gaps(times, 1.0) == [0.0, 10.0, 11.0, 1000.0, 1001.0]
    assert pq.clip_gaps([3.0], 0.99) == [0.0]


def test_offered_load_cuts_runtimes_at_the_window_end() -> None:
    # window [0, 10]: the first pod offers 1 GPU x 5 s, the second arrives at the end
    assert pq.offered_load([0.0, 10.0], [5.0, 100.0], [1000, 1000], 1000) == 0.5
    assert pq.offered_load([0.0, 10.0], [50.0, 1.0], [500, 1000], 1000) == 0.5


def test_compression_reaches_the_target_load() -> None:
    arrive = [float(i * 100) for i in range(50)]
    runtime = [30.0 + 7 * (i % 5) for i in range(50)]
    demand = [1000 * (1 + i % 3) for i in range(50)]
    for target in (0.5, 1.0, 1.2):
        k = pq.compression(arrive, runtime, demand, 4000, target)
        got = pq.offered_load([a / k for a in arrive], runtime, demand, 4000)
        assert got == pytest.approx(target, rel=1e-3)


def test_percentile_nearest_rank_below() -> None:
    assert pq.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == 4.0
    assert pq.percentile([7.0], 0.95) == 7.0
    assert pq.percentile([], 0.95) == 0.0


def _state() -> ClusterState:
    state = ClusterState()
    state.apply(c.ConfigurePartitions("p", 0.0, (c.PartitionDef(name="all", default=True),)))
    gpu = GpuDevice(index=0, vendor="trace", model="t", memory_mb=1)
    node = NodeSpec(name="n0", cpus=10, memory_mb=1000, agent_url="trace://", gpus=(gpu,))
    state.apply(c.RegisterNode("r", 0.0, node))
    return state


def _pod(job_id: int, gpus: int, arrive: float, runtime: float) -> Any:
    spec = JobSpec(
        script="#!/bin/sh\n",
        partition="all",
        cpus_per_task=1,
        mem_per_node_mb=1,
        gpus_per_node=gpus,
    )
    job = Job(
        job_id=job_id,
        spec=spec,
        partition="all",
        account="trace",
        time_limit_min=None,
        submit_time=0.0,
    )
    return pq.Pod(job, arrive, runtime, 1000 * gpus)


@pytest.mark.parametrize(("backfill", "waits"), [(True, [0.0, 9.0, 0.0]), (False, [0.0, 9.0, 8.0])])
def test_timed_queue_waits(backfill: bool, waits: list[float]) -> None:
    # A holds the only GPU 0..10; B (a GPU) waits for it; C (CPUs only) fits at once,
    # but under strict FIFO waits behind B.
    state = _state()
    pods = [_pod(1, 1, 0.0, 10.0), _pod(2, 1, 1.0, 5.0), _pod(3, 0, 2.0, 1.0)]
    arrive = [p.arrive for p in pods]
    mix = task_mix([p.job for p in pods])
    got = pq.timed(state, pods, arrive, pq.first_fit, mix, samples=4, backfill=backfill)
    assert got["mean_wait_s"] == round(sum(waits) / 3, 1)
    assert got["max_wait_s"] == max(waits)
    # GPU held by A over the whole window [0, 2]
    assert got["time_avg_allocated_share"] == 1.0
