"""Job steps in the state machine (scheduler/core/steps.py): created only in a running
job's attempt on its nodes, numbered from 0, ended once, cancelled with a signal to
their nodes, and ended with their job."""

from __future__ import annotations

import pickle

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.contract.steps import MAX_STEP_TASKS, StepState
from scheduler.core.effects import Emit, Signal
from scheduler.core.errors import Rejected
from scheduler.core.planner import plan
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit


def running(state: ClusterState, **kw: object) -> int:
    job_id = submit(state, **kw)
    allocate = plan(state, now=1002.0, cmd_id=cmd_id())
    assert allocate is not None
    state.apply(allocate)
    assert state.jobs[job_id].state is JobState.RUNNING
    return job_id


def step(state: ClusterState, job_id: int, *, nodes: tuple[str, ...] | None = None,
         ntasks: int = 1, attempt: int = 1, name: str = "hostname") -> list:  # fmt: skip
    job = state.jobs[job_id]
    return state.apply(
        c.CreateStep(cmd_id(), 1003.0, job_id, attempt, name, nodes or job.nodes[:1], ntasks)
    )


def test_steps_are_numbered_from_zero_and_emitted_with_the_job():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    job_id = running(state, nodes=2)
    effects = step(state, job_id, nodes=("sim01", "sim02"), ntasks=2)
    step(state, job_id)
    job = state.jobs[job_id]
    assert [(s.step_id, s.nodes, s.ntasks, s.state) for s in job.steps] == [
        (0, ("sim01", "sim02"), 2, StepState.RUNNING),
        (1, ("sim01",), 1, StepState.RUNNING),
    ]
    [emit] = effects
    assert isinstance(emit, Emit) and emit.job["steps"][0]["nodes"] == ["sim01", "sim02"]
    assert job.steps[0].cpus == sum(a.cpus for a in job.allocation.values())
    state.validate()


def test_the_same_proposal_twice_is_one_step():
    state = cluster(gpu_node("sim01"))
    job_id = running(state)
    command = c.CreateStep(cmd_id(), 1003.0, job_id, 1, "x", ("sim01",), 1)
    state.apply(command)
    assert state.apply(command) == []
    assert len(state.jobs[job_id].steps) == 1


@pytest.mark.parametrize(
    ("nodes", "ntasks", "attempt"),
    [
        (("sim02",), 1, 1),  # not the job's node
        (("sim01", "sim01"), 2, 1),  # the same node twice
        ((), 1, 1),  # no node
        (("sim01",), 0, 1),  # no task
        (("sim01",), MAX_STEP_TASKS + 1, 1),  # too many
        (("sim01",), 1, 2),  # another attempt
    ],
)
def test_a_step_outside_its_jobs_allocation_or_attempt_is_refused(nodes, ntasks, attempt):
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    job_id = running(state)
    with pytest.raises(Rejected):
        state.apply(c.CreateStep(cmd_id(), 1003.0, job_id, attempt, "x", nodes, ntasks))
    assert state.jobs[job_id].steps == ()


def test_a_pending_or_ended_job_takes_no_step():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state)
    with pytest.raises(Rejected) as refused:
        state.apply(c.CreateStep(cmd_id(), 1003.0, job_id, 0, "x", ("sim01",), 1))
    assert refused.value.code == "not_running"


def test_a_step_ends_once_with_its_exit_and_a_stale_report_changes_nothing():
    state = cluster(gpu_node("sim01"))
    job_id = running(state)
    step(state, job_id)
    state.apply(c.StepFinished(cmd_id(), 1004.0, job_id, 1, 0, 3, 0))
    again = state.apply(c.StepFinished(cmd_id(), 1005.0, job_id, 1, 0, 0, 0))
    stale = state.apply(c.StepFinished(cmd_id(), 1005.0, job_id, 7, 0, 0, 0))
    assert again == [] and stale == []
    s = state.jobs[job_id].steps[0]
    assert (s.state, s.exit_code, s.end_time) == (StepState.FAILED, 3, 1004.0)
    with pytest.raises(Rejected) as missing:
        state.apply(c.StepFinished(cmd_id(), 1005.0, job_id, 1, 9, 0, 0))
    assert missing.value.code == "not_found"


def test_cancelling_a_step_signals_its_nodes_only():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    job_id = running(state, nodes=2)
    step(state, job_id, nodes=("sim02",))
    effects = state.apply(c.CancelStep(cmd_id(), 1004.0, job_id, 0, 9))
    signals = [e for e in effects if isinstance(e, Signal)]
    assert [(e.node, e.signal, e.step_id) for e in signals] == [("sim02", 9, 0)]
    assert state.jobs[job_id].steps[0].state is StepState.CANCELLED
    assert state.jobs[job_id].state is JobState.RUNNING
    assert state.apply(c.CancelStep(cmd_id(), 1005.0, job_id, 0, 9)) == []


def test_a_job_that_ends_ends_its_running_steps():
    state = cluster(gpu_node("sim01"))
    job_id = running(state)
    step(state, job_id)
    step(state, job_id)
    state.apply(c.StepFinished(cmd_id(), 1004.0, job_id, 1, 0, 0, 0))
    state.apply(c.JobFinished(cmd_id(), 1005.0, job_id, 1, "sim01", 0, 0))
    states = [s.state for s in state.jobs[job_id].steps]
    assert states == [StepState.COMPLETED, StepState.FAILED]


def test_steps_survive_a_snapshot_and_an_older_one_reads_none():
    state = cluster(gpu_node("sim01"))
    job_id = running(state)
    step(state, job_id)
    copy = pickle.loads(pickle.dumps(state))
    assert copy.jobs[job_id].steps == state.jobs[job_id].steps
    job = copy.jobs[job_id]
    del job.__dict__["steps"]  # a job pickled before steps existed
    assert job.steps == () and job.to_dict()["steps"] == []
