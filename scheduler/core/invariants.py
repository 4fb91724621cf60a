"""`ClusterState.validate()`: every invariant of the state, checked from scratch.

Tests call it after every step; it derives everything again from the jobs, so a counter
or index that drifted from them (GPU owners, CPU and memory totals, the array throttle
count) is caught where it happened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.core import dependencies as deps
from scheduler.core.arrays import task_ids
from scheduler.core.contract import HOLDS_RESOURCES, JobState
from scheduler.core.jobs import Job, NodeAlloc
from scheduler.core.transitions import STOPPED_INTO

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState

# What a job that is stopping (COMPLETING) may end in: PENDING is requeued once stopped.
END_STATES = frozenset({*STOPPED_INTO, JobState.PENDING})


def validate(state: ClusterState) -> None:
    _resources(state)
    for job in state.jobs.values():
        _job(state, job)
    _arrays(state)
    for account, (value, _) in state.usage_gpu_s.items():
        assert value >= 0, f"account {account} has negative usage"
    assert all(j < state.next_job_id for j in state.jobs)
    assert all(v in state.jobs or v < state.next_job_id for v in state.submissions.values())


def _resources(state: ClusterState) -> None:
    held: dict[str, dict[int, NodeAlloc]] = {n: {} for n in state.nodes}
    for job in state.jobs.values():
        if job.state in HOLDS_RESOURCES:
            assert job.allocation, f"job {job.job_id} {job.state} without allocation"
            assert job.attempt >= 1
            for name, alloc in job.allocation.items():
                assert name in state.nodes, f"job {job.job_id} on unknown node {name}"
                assert state.nodes[name].up or job.state is JobState.COMPLETING, (
                    f"running job {job.job_id} on down node {name}"
                )
                held[name][job.job_id] = alloc
        else:
            for name in job.allocation:
                node = state.nodes.get(name)
                assert node is None or job.job_id not in node.jobs, (
                    f"{job.state} job {job.job_id} still holds {name}"
                )
    for name, node in state.nodes.items():
        allocs = held[name]
        # Milli-GPU shares, partitions and CPU binding: the node checks its own books.
        node.check(allocs)
        assert node.cpus_alloc == sum(a.cpus for a in allocs.values()), f"{name} cpus drifted"
        assert node.mem_alloc_mb == sum(a.mem_mb for a in allocs.values()), f"{name} mem drifted"
        assert 0 <= node.cpus_alloc <= node.spec.cpus, f"node {name} CPUs overcommitted"
        assert 0 <= node.mem_alloc_mb <= node.spec.memory_mb, f"node {name} memory over"


def _job(state: ClusterState, job: Job) -> None:
    jid = job.job_id
    if job.state is JobState.PENDING:
        assert not job.allocation, f"pending job {jid} holds resources"
        assert job.end_state is None, f"pending job {jid} has an end state"
    if job.state is JobState.COMPLETING:
        assert job.end_state in END_STATES, f"completing job {jid} has no end state"
    elif job.state is not JobState.PENDING:
        assert job.end_state is None, f"{job.state} job {jid} still has an end state"
    assert job.hold in ("", "user", "admin"), f"job {jid} has hold {job.hold!r}"
    assert not (job.hold and job.state is JobState.RUNNING), f"running job {jid} is held"
    assert (job.suspended_at is not None) == (job.state is JobState.SUSPENDED), (
        f"{job.state} job {jid}: suspended_at {job.suspended_at}"
    )
    assert job.suspended_s >= 0, f"job {jid} was suspended for a negative time"
    assert (job.depends is None) == (not job.spec.dependency.strip()), (
        f"job {jid}: parsed dependency out of step with its spec"
    )
    if job.state.is_active and job.depends is not None:
        for term in job.depends.terms:
            if term.kind != "singleton":
                assert term.job_id < jid, f"job {jid} depends on a later job {term.job_id}"
                assert term.job_id in state.jobs or term.job_id in state.array_tasks, (
                    f"job {jid} depends on job {term.job_id}, which was purged"
                )
    assert deps.referenced(job.depends) is not None


def _arrays(state: ClusterState) -> None:
    active: dict[int, int] = {}
    remainders: dict[int, int] = {}
    for job in state.jobs.values():
        if job.array_job_id is None:
            assert job.array_task_id is None and not job.array_throttle
            assert not job.array_pending, f"job {job.job_id} has tasks but no array"
            continue
        tasks = state.array_tasks.get(job.array_job_id, ())
        assert job.job_id in tasks, f"task {job.display_id} missing from its array"
        assert job.job_id >= job.array_job_id
        ids = task_ids(job.spec.array)
        assert job.array_task_id == ids[job.job_id - job.array_job_id], (
            f"job {job.job_id} is not task {job.array_task_id} of its array"
        )
        if job.array_pending:
            jid = job.job_id
            assert job.state is JobState.PENDING, f"{job.state} job {jid} holds pending tasks"
            assert job.array_job_id not in remainders, f"array {job.array_job_id}: two remainders"
            remainders[job.array_job_id] = jid
            pending = job.array_pending
            assert list(pending) == sorted(set(pending)) and pending[0] > jid, (
                f"remainder {jid}: task ids out of order"
            )
            for task in pending:
                assert task in tasks and task not in state.jobs, (
                    f"remainder {jid}: task {task} is also a job, or not of its array"
                )
        if job.state in HOLDS_RESOURCES:
            active[job.array_job_id] = active.get(job.array_job_id, 0) + 1
    assert active == state.array_active, "array task counts drifted"
    assert remainders == state.remainders.holder, "the remainders' holders drifted"
    assert state.remainders.arrays == sorted(remainders), "the remainders' arrays drifted"
    waiting: dict[str, int] = {}
    for job in state.jobs.values():
        if job.state is JobState.PENDING:
            waiting[job.account] = waiting.get(job.account, 0) + job.task_count
    assert waiting == state.waiting, "pending jobs per account drifted"
    for array_id, tasks in state.array_tasks.items():
        assert tasks and min(tasks) >= array_id, f"array {array_id} task ids wrong"
        jobs = [state.jobs[t] for t in tasks if t in state.jobs]
        assert jobs, f"array {array_id} has no record left"
        own = [j.array_task_id for j in jobs]
        assert len(own) == len(set(own)), f"array {array_id} repeats a task id"
        throttle = max((j.array_throttle for j in jobs), default=0)
        if throttle:
            assert active.get(array_id, 0) <= throttle, f"array {array_id} passed its %{throttle}"
