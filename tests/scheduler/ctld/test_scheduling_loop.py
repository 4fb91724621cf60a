"""What wakes the leader's scheduling loop, how often it plans, and what it does off the
per-pass path: a submission that cannot start now wakes nothing; under a stream of
submissions a pass starts at most every `pass_min_interval_s` and plans what came
meanwhile; and the once-a-second sweep ends the running jobs past their time limit (found
from the nodes' jobs, not by reading every job the state keeps)."""

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
from scheduler.ctld.dispatch import LAUNCH_TASK, Dispatcher
from tests.fixtures.controller import write_controller_config
from tests.fixtures.processes import free_port, wait_until
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, spec
from tests.scheduler.ctld.test_dispatch import RecordingBroker


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


def lone_replica(tmp_path: Path, controller_extra: str = "") -> spur_config.SpurConfig:
    """The config of a lone replica with a private journal and file broker."""
    path = tmp_path / "spur.toml"
    write_controller_config(
        path,
        token="loop-test-token",
        http_port=free_port(),
        raft_port=free_port(),
        state_dir=tmp_path / "ctld",
        broker_url="filesystem://",
        broker_folder=tmp_path / "broker",
        controller_extra=controller_extra,
    )
    return spur_config.load(path, env={})


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    """A lone replica's controller, its loop not started: the test drives it."""
    ctl = Controller(lone_replica(tmp_path))
    try:
        wait_until(lambda: ctl.replica.is_leader, timeout=30, what="leader")
        yield ctl
    finally:
        ctl.replica.destroy()


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-0.1, "must be a non-negative number"),
        (1.5, "must be at most 1"),
        ("fast", "must be a number"),
        (True, "must be a number"),
    ],
)
def test_the_least_interval_between_passes_is_checked(value: object, error: str) -> None:
    def controller(**values: object) -> dict[str, object]:
        return {"cluster": {"token": "t"}, "controller": values}

    assert spur_config.parse(controller()).controller.pass_min_interval_s == 0.03
    assert spur_config.parse(controller(pass_min_interval_s=0)).controller.pass_min_interval_s == 0
    with pytest.raises(spur_config.ConfigError, match=error):
        spur_config.parse(controller(pass_min_interval_s=value))


def running_controller(
    tmp_path: Path, pass_min_interval_s: float
) -> tuple[Controller, RecordingBroker]:
    """A lone replica's controller with its loop running, its tasks sent to a broker
    that records them (Celery's, a third-party boundary)."""
    config = lone_replica(tmp_path, f"pass_min_interval_s = {pass_min_interval_s}")
    assert config.controller.pass_min_interval_s == pass_min_interval_s
    broker = RecordingBroker()
    broker.gate.set()
    ctl = Controller(
        config,
        dispatcher=Dispatcher(broker, cluster="c", kill_wait_s=5, signing_key=b"k"),
    )
    ctl.start()
    # The leader's loop commits the configured partitions first.
    wait_until(lambda: bool(ctl.replica.state.partitions), timeout=30, what="partitions")
    ctl.replica.commit(c.RegisterNode(cmd_id(), time.time(), gpu_node("n1")))
    return ctl, broker


def launched_together(broker: RecordingBroker, jobs: int) -> list[list[int]]:
    """The jobs of each launch task, once `jobs` jobs were launched."""

    def tasks() -> list[list[int]]:
        sent = list(broker.sent)
        return [[p["job_id"] for p in batch] for name, batch in sent if name == LAUNCH_TASK]  # type: ignore[attr-defined]

    wait_until(lambda: sum(map(len, tasks())) == jobs, timeout=30, what="launches")
    return tasks()


@pytest.mark.parametrize(("least", "passes"), [(1.0, (1, 2)), (0.0, (4,))])
def test_a_stream_of_submissions_is_planned_at_most_once_an_interval(
    tmp_path: Path, least: float, passes: tuple[int, ...]
) -> None:
    """Submissions 0.2 s apart: with a second between passes, the four (0.6 s from the
    first to the last) are planned by one pass or two, each sending one launch task for
    the node; without an interval, each is planned as it comes (a pass and a task each)."""
    ctl, broker = running_controller(tmp_path, least)
    try:
        ids = []
        for _ in range(4):
            ids.append(ctl.replica.commit(c.SubmitJob(cmd_id(), time.time(), spec())))
            time.sleep(0.2)
        tasks = launched_together(broker, 4)
        assert sorted(j for task in tasks for j in task) == sorted(ids)
        assert len(tasks) in passes
    finally:
        ctl.stop()


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
