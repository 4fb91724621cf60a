"""Reports are idempotent by (job, attempt), and a job that vanished from its node
without one ends NODE_FAIL (`JobVanished`): what the agent's outbox and the leader's
heartbeat reconciliation rely on."""

from __future__ import annotations

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.effects import Emit, Signal
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit
from tests.scheduler.core.test_state import schedule


def test_a_report_sent_twice_changes_nothing_the_second_time():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state, gpus_per_node=2)
    schedule(state)
    assert state.apply(c.JobStarted(cmd_id(), 1003.0, job_id, 1, "sim01", 42))
    before = state.to_bytes()
    assert state.apply(c.JobStarted(cmd_id(), 1004.0, job_id, 1, "sim01", 42)) == []
    assert state.to_bytes() == before
    assert state.apply(c.JobFinished(cmd_id(), 1005.0, job_id, 1, "sim01", 0, 0))
    before = state.to_bytes()
    # The outbox resends what it could not see acknowledged: the same report, again.
    assert state.apply(c.JobFinished(cmd_id(), 1006.0, job_id, 1, "sim01", 0, 0)) == []
    assert state.apply(c.JobStarted(cmd_id(), 1006.0, job_id, 1, "sim01", 42)) == []
    assert state.to_bytes() == before
    assert state.jobs[job_id].state is JobState.COMPLETED
    state.validate()


def test_a_vanished_job_ends_node_fail_and_frees_its_gpus():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    job_id = submit(state, gpus_per_node=8, nodes=2)
    schedule(state)
    job = state.jobs[job_id]
    first, other = job.nodes
    effects = state.apply(c.JobVanished(cmd_id(), 1004.0, job_id, 1, first, "gone"))
    assert (job.state, job.reason) == (JobState.NODE_FAIL, "gone")
    # Whatever of it runs on its other node is killed there.
    assert [(e.node, e.signal) for e in effects if isinstance(e, Signal)] == [(other, 9)]
    assert [e.kind for e in effects if isinstance(e, Emit)] == ["finished"]
    assert all(len(state.nodes[n].free_gpus()) == 8 for n in (first, other))
    state.validate()


def test_a_vanished_requeueable_job_goes_back_to_the_queue():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state, requeue=True)
    schedule(state)
    state.apply(c.JobVanished(cmd_id(), 1004.0, job_id, 1, "sim01"))
    assert state.jobs[job_id].state is JobState.PENDING
    state.validate()


def test_a_vanished_job_that_was_being_cancelled_ends_cancelled():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state)
    schedule(state)
    state.apply(c.CancelJob(cmd_id(), 1003.0, job_id))
    state.apply(c.JobVanished(cmd_id(), 1004.0, job_id, 1, "sim01"))
    assert state.jobs[job_id].state is JobState.CANCELLED
    state.validate()


def test_a_stale_vanishing_changes_nothing():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    job_id = submit(state, nodes=2)
    schedule(state)
    other = state.jobs[job_id].nodes[1]
    before = state.to_bytes()
    assert state.apply(c.JobVanished(cmd_id(), 1004.0, job_id, 2, "sim01")) == []  # attempt
    assert state.apply(c.JobVanished(cmd_id(), 1004.0, job_id, 1, other)) == []  # not batch host
    assert state.apply(c.JobVanished(cmd_id(), 1004.0, 999, 1, "sim01")) == []  # unknown
    assert state.to_bytes() == before
    state.apply(c.JobFinished(cmd_id(), 1005.0, job_id, 1, state.jobs[job_id].nodes[0], 0, 0))
    before = state.to_bytes()
    # The report came first: the leader's late verdict finds the job ended.
    assert state.apply(c.JobVanished(cmd_id(), 1006.0, job_id, 1, "sim01")) == []
    assert state.to_bytes() == before
    assert state.jobs[job_id].state is JobState.COMPLETED
