"""scontrol suspend and resume: RUNNING <-> SUSPENDED, operators only; a suspended job keeps
its resources, its time limit counts only the time it ran, and it can be cancelled,
requeued, or lost with its node."""

from __future__ import annotations

import pickle

import pytest

from scheduler.core import commands as c
from scheduler.core.backfill import expected_end
from scheduler.core.contract import HOLDS_RESOURCES, JobState
from scheduler.core.effects import Emit, Signal
from scheduler.core.errors import Rejected
from scheduler.core.state import ClusterState
from scheduler.core.transitions import SIGCONT, SIGSTOP
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit
from tests.scheduler.core.test_lifecycle import T0, finish, start


def running_job(*, time_limit_min: int | None = 10, nodes: int = 1) -> tuple[ClusterState, int]:
    state = cluster(gpu_node("n1"), gpu_node("n2"), now=T0)
    job_id = submit(state, gpus_per_node=2, nodes=nodes, time_limit_min=time_limit_min)
    assert start(state, job_id, now=T0 + 10)
    return state, job_id


def suspend(state: ClusterState, job_id: int, now: float, *, admin: bool = True) -> list:
    effects = state.apply(c.SuspendJob(cmd_id(), now, job_id, admin=admin))
    state.validate()
    return effects


def resume(state: ClusterState, job_id: int, now: float, *, admin: bool = True) -> list:
    effects = state.apply(c.ResumeJob(cmd_id(), now, job_id, admin=admin))
    state.validate()
    return effects


def signals(effects: list) -> list[tuple[str, int, bool]]:
    return [(e.node, e.signal, e.escalate) for e in effects if isinstance(e, Signal)]


def test_suspend_stops_the_job_on_every_node_and_keeps_its_resources() -> None:
    state, job_id = running_job(nodes=2)
    held = {n: set(node.jobs) for n, node in state.nodes.items()}
    effects = suspend(state, job_id, T0 + 40)
    job = state.jobs[job_id]
    assert job.state is JobState.SUSPENDED and job.state in HOLDS_RESOURCES
    assert job.suspended_at == T0 + 40
    assert sorted(signals(effects)) == [("n1", SIGSTOP, False), ("n2", SIGSTOP, False)]
    (event,) = [e for e in effects if isinstance(e, Emit)]
    assert (event.kind, event.job["state"], event.job["suspended_at"]) == (
        "suspended",
        "SUSPENDED",
        T0 + 40,
    )
    assert {n: set(node.jobs) for n, node in state.nodes.items()} == held


def test_resume_continues_it_and_counts_the_time_it_was_suspended() -> None:
    state, job_id = running_job(nodes=2)
    suspend(state, job_id, T0 + 40)
    effects = resume(state, job_id, T0 + 100)
    job = state.jobs[job_id]
    assert job.state is JobState.RUNNING and job.suspended_at is None
    assert job.suspended_s == 60
    assert sorted(signals(effects)) == [("n1", SIGCONT, False), ("n2", SIGCONT, False)]
    suspend(state, job_id, T0 + 200)
    resume(state, job_id, T0 + 210)
    assert state.jobs[job_id].suspended_s == 70


def test_the_time_limit_counts_only_the_time_the_job_ran() -> None:
    state, job_id = running_job(time_limit_min=10)  # started at T0+10: due at T0+610
    assert state.jobs[job_id].run_deadline() == T0 + 610
    suspend(state, job_id, T0 + 100)
    assert state.jobs[job_id].run_deadline() is None  # a suspended job never runs out
    assert expected_end(state.jobs[job_id], T0 + 100) == float("inf")
    assert state.apply(c.TimeLimitReached(cmd_id(), T0 + 700, job_id, 1)) == []
    resume(state, job_id, T0 + 400)  # 300 s suspended
    assert state.jobs[job_id].run_deadline() == T0 + 910
    # A limit the leader judged before the suspension moved the deadline is stale.
    assert state.apply(c.TimeLimitReached(cmd_id(), T0 + 700, job_id, 1)) == []
    assert state.jobs[job_id].state is JobState.RUNNING
    effects = state.apply(c.TimeLimitReached(cmd_id(), T0 + 911, job_id, 1))
    assert signals(effects) == [("n1", 15, True)]
    finish(state, job_id, exit_code=0, now=T0 + 912)
    assert state.jobs[job_id].state is JobState.TIMEOUT


def test_only_an_operator_may_suspend_or_resume() -> None:
    state, job_id = running_job()
    before = state.to_bytes()
    with pytest.raises(Rejected, match="Access/permission denied") as refused:
        suspend(state, job_id, T0 + 40, admin=False)
    assert refused.value.code == "permission"
    assert state.to_bytes() == before
    suspend(state, job_id, T0 + 40)
    with pytest.raises(Rejected, match="Access/permission denied"):
        resume(state, job_id, T0 + 50, admin=False)
    assert state.jobs[job_id].state is JobState.SUSPENDED


def test_it_refuses_with_slurms_words_what_the_state_does_not_allow() -> None:
    state, job_id = running_job()
    pending = submit(state, gpus_per_node=8, nodes=2)
    for command in (c.SuspendJob, c.ResumeJob):
        with pytest.raises(Rejected, match="^Job is pending execution$") as refused:
            state.apply(command(cmd_id(), T0 + 30, pending, admin=True))
        assert refused.value.code == "not_running"
    with pytest.raises(Rejected, match="^Job is not suspended$"):
        resume(state, job_id, T0 + 30)
    with pytest.raises(Rejected, match="Invalid job id specified"):
        suspend(state, 999, T0 + 30)
    # Suspending a suspended job is no error, and changes nothing (as in Slurm).
    suspend(state, job_id, T0 + 40)
    before = state.to_bytes()
    assert suspend(state, job_id, T0 + 50) == []
    assert state.to_bytes() == before
    state.apply(c.CancelJob(cmd_id(), T0 + 60, job_id))
    for command in (c.SuspendJob, c.ResumeJob):
        with pytest.raises(Rejected, match="^Job/step already completing or completed$"):
            state.apply(command(cmd_id(), T0 + 61, job_id, admin=True))


def test_a_suspended_job_is_cancelled_for_real() -> None:
    state, job_id = running_job()
    suspend(state, job_id, T0 + 40)
    effects = state.apply(c.CancelJob(cmd_id(), T0 + 70, job_id, by="ann"))
    state.validate()
    job = state.jobs[job_id]
    # SIGTERM, escalated to SIGKILL; the agent continues the job along with it.
    assert signals(effects) == [("n1", 15, True)]
    assert job.state is JobState.COMPLETING and job.suspended_s == 30
    finish(state, job_id, exit_code=0, now=T0 + 71)
    assert job.state is JobState.CANCELLED
    assert all(not node.jobs for node in state.nodes.values())


def test_a_suspended_job_can_be_requeued_and_starts_afresh() -> None:
    state, job_id = running_job()
    suspend(state, job_id, T0 + 40)
    state.apply(c.RequeueJob(cmd_id(), T0 + 50, job_id))
    finish(state, job_id, now=T0 + 51)
    job = state.jobs[job_id]
    assert job.state is JobState.PENDING and (job.suspended_at, job.suspended_s) == (None, 0)
    assert start(state, job_id, now=T0 + 60)
    assert job.attempt == 2 and job.run_deadline() == T0 + 660


@pytest.mark.parametrize("requeue", [False, True])
def test_a_suspended_job_on_a_lost_node_fails_or_is_requeued(requeue: bool) -> None:
    state = cluster(gpu_node("n1"), now=T0)
    job_id = submit(state, gpus_per_node=2, requeue=requeue)
    start(state, job_id)
    suspend(state, job_id, T0 + 40)
    state.apply(c.NodeLost(cmd_id(), T0 + 90, "n1"))
    state.validate()
    assert state.jobs[job_id].state is (JobState.PENDING if requeue else JobState.NODE_FAIL)


def test_a_job_that_ended_as_it_was_suspended_ends_as_it_did() -> None:
    state, job_id = running_job()
    suspend(state, job_id, T0 + 40)
    finish(state, job_id, exit_code=3, now=T0 + 41)
    assert state.jobs[job_id].state is JobState.FAILED


def test_a_job_suspended_before_its_start_report_is_stopped_once_it_starts() -> None:
    state, job_id = running_job()
    suspend(state, job_id, T0 + 11)
    effects = state.apply(c.JobStarted(cmd_id(), T0 + 12, job_id, 1, "n1", 4242))
    assert signals(effects) == [("n1", SIGSTOP, False)]


def test_a_new_leader_redoes_suspensions_and_resumptions() -> None:
    state, job_id = running_job()
    state.apply(c.JobStarted(cmd_id(), T0 + 12, job_id, 1, "n1", 4242))
    other = submit(state, gpus_per_node=2)
    start(state, other, now=T0 + 13)
    state.apply(c.JobStarted(cmd_id(), T0 + 14, other, 1, "n1", 4243))
    suspend(state, job_id, T0 + 40)
    assert [(e.job_id, e.signal) for e in state.redo_effects() if isinstance(e, Signal)] == [
        (job_id, SIGSTOP)
    ]
    resume(state, job_id, T0 + 50)
    assert [(e.job_id, e.signal) for e in state.redo_effects() if isinstance(e, Signal)] == [
        (job_id, SIGCONT)
    ]


def test_a_suspension_survives_a_raft_snapshot_byte_for_byte() -> None:
    state, job_id = running_job()
    suspend(state, job_id, T0 + 40)
    copy = pickle.loads(pickle.dumps(state))
    assert copy.to_bytes() == state.to_bytes()
    assert b'"suspended_at":1040.0' in state.to_bytes()
    resume(copy, job_id, T0 + 50)
    assert copy.jobs[job_id].suspended_s == 10
