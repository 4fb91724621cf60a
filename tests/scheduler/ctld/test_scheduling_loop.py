"""What wakes the leader's scheduling loop, and what it does off the per-pass path: a
submission that cannot start now wakes nothing, and the once-a-second sweep ends the
running jobs past their time limit (found from the nodes' jobs, not by reading every
job the state keeps)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import config as spur_config
from scheduler.core import commands as c
from scheduler.core.planner import plan_pass
from scheduler.core.state import ClusterState
from scheduler.ctld import sweeps
from scheduler.ctld.controller import Controller, _startable, new_id
from tests.fixtures.controller import write_controller_config
from tests.fixtures.processes import free_port, wait_until
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, spec


def submitted_effects(state: ClusterState, **kw: object) -> list[object]:
    return list(state.apply(c.SubmitJob(cmd_id(), 1000.0, spec(**kw))))


def test_only_a_submission_that_may_start_now_wakes_the_loop() -> None:
    state = cluster(gpu_node("n1"))
    assert _startable(submitted_effects(state))  # type: ignore[arg-type]
    assert not _startable(submitted_effects(state, hold=True))  # type: ignore[arg-type]
    assert not _startable(submitted_effects(state, begin_time=5000.0))  # type: ignore[arg-type]
    assert not _startable(submitted_effects(state, dependency="afterok:1"))  # type: ignore[arg-type]
    # A retried submission (its key already taken) changes nothing and wakes nothing.
    again = c.SubmitJob("same-key", 1000.0, spec())
    assert _startable(state.apply(again))
    assert not _startable(state.apply(again))


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    """A lone replica's controller, its loop not started: the test drives it."""
    path = tmp_path / "spur.toml"
    write_controller_config(
        path,
        token="sweep-test-token",
        http_port=free_port(),
        raft_port=free_port(),
        state_dir=tmp_path / "ctld",
        broker_url="filesystem://",
        broker_folder=tmp_path / "broker",
    )
    ctl = Controller(spur_config.load(path, env={}))
    try:
        wait_until(lambda: ctl.replica.is_leader, timeout=30, what="leader")
        yield ctl
    finally:
        ctl.replica.destroy()


def test_the_sweep_ends_a_running_job_past_its_time_limit_and_no_other(
    controller: Controller,
) -> None:
    replica = controller.replica
    partitions = (c.PartitionDef("gpu", default=True),)
    replica.commit(c.ConfigurePartitions(cmd_id(), time.time(), partitions))
    replica.commit(c.RegisterNode(cmd_id(), time.time(), gpu_node("n1")))
    long_ago = time.time() - 600  # both start then: one has a minute, one an hour
    over = replica.commit(c.SubmitJob(cmd_id(), long_ago, spec(name="over", time_limit_min=1)))
    within = replica.commit(c.SubmitJob(cmd_id(), long_ago, spec(name="ok", time_limit_min=60)))
    waiting = replica.commit(c.SubmitJob(cmd_id(), long_ago, spec(name="held", hold=True)))
    with replica.lock:
        plan = plan_pass(replica.state, now=long_ago, cmd_id=cmd_id())
    assert plan.allocate is not None
    replica.commit(plan.allocate)
    sweeps.end_overdue_jobs(replica, new_id)
    with replica.lock:
        jobs = replica.state.jobs
        assert jobs[over].end_state is not None and jobs[over].end_state.value == "TIMEOUT"
        assert jobs[within].state.value == "RUNNING"
        assert jobs[waiting].state.value == "PENDING"
