"""A job's run on its nodes: the plan's placements start it (`Allocate`), its time limit
stops it (`TimeLimitReached`), and its batch host's agent says it started, finished or
vanished (`JobStarted`, `JobFinished`, `JobVanished`). Command handlers of
`ClusterState`, kept apart (as submit.py, steps.py, update.py) to keep each module
readable; every change of a job's state still goes through the transition table.

A report is checked against the job's attempt and state before it counts: agents report
again after a restart or a lost answer, and an earlier attempt's report arrives late.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.core import arrays
from scheduler.core import commands as c
from scheduler.core.contract import HOLDS_RESOURCES, JobState
from scheduler.core.effects import Effect
from scheduler.core.jobs import Job
from scheduler.core.placement import allocation_fits
from scheduler.core.transitions import SIGKILL, SIGSTOP

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState


def time_limit(state: ClusterState, cmd: c.TimeLimitReached) -> list[Effect]:
    job = state.job(cmd.job_id)
    if job.state is not JobState.RUNNING or job.attempt != cmd.attempt:
        return []
    deadline = job.run_deadline()
    if deadline is None or cmd.now < deadline:
        return []  # stale: it was suspended since, which moved its deadline on
    return state.transition(
        job, JobState.COMPLETING, cmd.now, end_state=JobState.TIMEOUT, kind="timeout"
    )


def allocate(state: ClusterState, cmd: c.Allocate) -> list[Effect]:
    effects: list[Effect] = []
    for placement in cmd.placements:
        job = state.lookup(placement.job_id)
        if job is None or job.state is not JobState.PENDING or not placement.nodes:
            continue  # a stale plan: the job was cancelled or placed meanwhile
        if job.array_pending:
            job = arrays.task_of(job, job.job_id)  # the remainder's task, to check
        if not _placement_fits(state, job, placement):
            continue
        # Re-checked here, not only by the planner: a hold, a dependency or the array
        # throttle may have changed since the plan, and several tasks of one array
        # in one plan must not pass its `%N` together.
        why = state.blocked_reason(job, cmd.now)
        if why is not None:
            if placement.job_id in state.jobs:  # a remainder's other tasks wait as it does
                effects.extend(state.set_reason(state.jobs[job.job_id], why, cmd.now, "pending"))
            continue
        job = state.named(job.job_id, cmd.now)
        effects.extend(
            state.transition(job, JobState.RUNNING, cmd.now, allocation=dict(placement.nodes))
        )
    for job_id, reason in cmd.reasons:
        job = state.jobs.get(job_id)
        if job is not None and job.state is JobState.PENDING:
            effects.extend(state.set_reason(job, reason, cmd.now, "pending"))
    return effects


def _placement_fits(state: ClusterState, job: Job, placement: c.Placement) -> bool:
    names = [n for n, _ in placement.nodes]
    if len(set(names)) != len(names) or len(names) != job.spec.nodes:
        return False
    members = set(n.name for n in state.partition_nodes(job.partition))
    for name, alloc in placement.nodes:
        node = state.nodes.get(name)
        if node is None or name not in members:
            return False
        if not allocation_fits(job, node, alloc):
            return False
    return True


def started(state: ClusterState, cmd: c.JobStarted) -> list[Effect]:
    job = state.jobs.get(cmd.job_id)
    if job is None or job.attempt != cmd.attempt or job.state not in HOLDS_RESOURCES:
        return []  # stale report of an earlier attempt: acknowledged, ignored
    if job.pid is not None:
        return []
    job.pid = cmd.pid
    job.started_at = cmd.now
    job.limits = cmd.limits
    effects: list[Effect] = [state.emit(job, "started", cmd.now)]
    if job.state is JobState.SUSPENDED:
        # Suspended before its script started: the first SIGSTOP may have found
        # nothing to stop on the node; now there is.
        effects[:0] = state.signal_effects(job, SIGSTOP)
    return effects


def finished(state: ClusterState, cmd: c.JobFinished) -> list[Effect]:
    job = state.jobs.get(cmd.job_id)
    if job is None or job.attempt != cmd.attempt or job.state not in HOLDS_RESOURCES:
        return []
    if job.nodes and cmd.node != job.nodes[0]:
        return []  # only the batch host's report ends the job
    if job.state is JobState.COMPLETING and job.end_state is not None:
        final = job.end_state
    elif cmd.oom:
        final = JobState.OUT_OF_MEMORY
    elif cmd.exit_code == 0 and cmd.signal == 0:
        final = JobState.COMPLETED
    else:
        final = JobState.FAILED
    if final is JobState.PENDING:  # stopped to be requeued
        return state.transition(job, final, cmd.now)
    if cmd.reason and final in (JobState.FAILED, JobState.OUT_OF_MEMORY):
        job.reason = cmd.reason
    return state.transition(job, final, cmd.now, exit_code=cmd.exit_code, signal=cmd.signal)


def vanished(state: ClusterState, cmd: c.JobVanished) -> list[Effect]:
    job = state.jobs.get(cmd.job_id)
    if (
        job is None
        or job.attempt != cmd.attempt
        or job.state not in HOLDS_RESOURCES
        or not job.nodes
        or job.nodes[0] != cmd.node
    ):
        return []  # stale: its report arrived, or it was already ended or requeued
    others = [n for n in job.nodes if n != cmd.node]
    effects = list(state.signal_effects(job, SIGKILL, only=others))
    if job.state is JobState.COMPLETING and job.end_state is not None:
        end = job.end_state  # being stopped (cancel, time limit, preemption): it was
    else:
        end = JobState.PENDING if job.spec.requeue else JobState.NODE_FAIL
    if end is not JobState.PENDING:
        job.reason = cmd.reason
    effects.extend(state.transition(job, end, cmd.now))
    return effects
