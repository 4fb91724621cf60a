"""An array's pending tasks as one record (its remainder): what a pass starts of it, what
it says of the rest, and what commands and readers see of its tasks."""

from __future__ import annotations

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.effects import Emit, Launch
from scheduler.core.planner import Plan, plan_pass
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit
from tests.scheduler.core.test_ranking_props import assert_index_fresh, assert_same

T0 = 1000.0


def three_nodes() -> ClusterState:
    return cluster(gpu_node("n1"), gpu_node("n2"), gpu_node("n3"), now=T0)


def schedule(state: ClusterState, now: float) -> tuple[Plan, list[Emit]]:
    """A pass as the leader runs it (checked against a full one), and its commit."""
    cid = cmd_id()
    kept = plan_pass(state, now=now, cmd_id=cid, check_every=1)
    assert_same(kept, plan_pass(state, now=now, cmd_id=cid, full=True))
    assert_index_fresh(state, now)
    effects = state.apply(kept.allocate) if kept.allocate is not None else []
    state.validate()
    return kept, [e for e in effects if isinstance(e, Emit)]


def states(state: ClusterState, array: int) -> list[tuple[int, str]]:
    tasks = [j for j in state.listed([array])]
    return [(j.array_task_id or 0, j.state.value) for j in tasks]


def test_a_pass_starts_as_many_tasks_of_an_array_as_fit_and_the_rest_stays_one_record():
    state = three_nodes()
    first = submit(state, now=T0, array="0-29", gpus_per_node=1)
    plan, events = schedule(state, T0 + 1)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == list(range(first, first + 24))
    # The first task that did not start stands for the rest, and waits on Resources.
    assert plan.allocate.reasons == ((first + 24, "Resources"),)
    rest = state.jobs[first + 24]
    assert rest.array_pending == tuple(range(first + 25, first + 30))
    assert rest.reason == "Resources" and rest.display_id == f"{first}_[24-29]"
    assert len(state.jobs) == 25
    # An event per started task, and one for the remainder.
    kinds = {(e.job_id, e.kind) for e in events}
    assert (first + 24, "remainder") in kinds and (first + 3, "allocated") in kinds
    assert states(state, first).count((0, "RUNNING")) == 1
    # A task that ends lets the next one start, out of the remainder.
    job = state.jobs[first]
    state.apply(c.JobFinished(cmd_id(), T0 + 2, first, job.attempt, job.nodes[0], 0))
    plan, _ = schedule(state, T0 + 3)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == [first + 24]
    assert state.jobs[first + 25].array_pending == tuple(range(first + 26, first + 30))


def test_a_pass_starts_no_more_tasks_than_the_throttle_and_the_rest_say_so_next():
    state = three_nodes()
    first = submit(state, now=T0, array="0-9%3", gpus_per_node=1)
    plan, _ = schedule(state, T0 + 1)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == [first, first + 1, first + 2]
    plan, _ = schedule(state, T0 + 2)
    assert plan.allocate is not None and not plan.allocate.placements
    assert plan.allocate.reasons == ((first + 3, "JobArrayTaskLimit"),)
    assert state.jobs[first + 3].array_pending == tuple(range(first + 4, first + 10))
    # A task's end lets one more go; the reason moves on with the remainder.
    job = state.jobs[first + 1]
    state.apply(c.JobFinished(cmd_id(), T0 + 3, job.job_id, job.attempt, job.nodes[0], 0))
    plan, _ = schedule(state, T0 + 4)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == [first + 3]
    schedule(state, T0 + 5)
    assert state.jobs[first + 4].reason == "JobArrayTaskLimit"


def test_a_singleton_array_runs_its_tasks_one_at_a_time():
    state = three_nodes()
    first = submit(state, now=T0, array="0-3", name="one", dependency="singleton")
    plan, _ = schedule(state, T0 + 1)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == [first]
    schedule(state, T0 + 2)
    assert state.jobs[first + 1].reason == "Dependency"
    job = state.jobs[first]
    state.apply(c.JobFinished(cmd_id(), T0 + 3, first, job.attempt, job.nodes[0], 0))
    plan, _ = schedule(state, T0 + 4)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == [first + 1]


def test_a_dependency_on_an_array_waits_for_its_remainder_too():
    state = three_nodes()
    array = submit(state, now=T0, array="0-3", gpus_per_node=8)  # three fit at once
    after = submit(state, now=T0, dependency=f"afterok:{array}")
    schedule(state, T0 + 1)
    assert state.jobs[after].reason == "Dependency"
    for job_id in range(array, array + 3):
        job = state.jobs[job_id]
        state.apply(c.JobFinished(cmd_id(), T0 + 2, job_id, job.attempt, job.nodes[0], 0))
    assert state.blocked_reason(state.jobs[after], T0 + 3) == "Dependency"  # task 3 waits
    plan, _ = schedule(state, T0 + 3)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == [array + 3]
    job = state.jobs[array + 3]
    state.apply(c.JobFinished(cmd_id(), T0 + 4, array + 3, job.attempt, job.nodes[0], 0))
    plan, _ = schedule(state, T0 + 5)
    assert plan.allocate is not None
    assert [p.job_id for p in plan.allocate.placements] == [after]


def test_cancelling_every_task_of_an_array_cancels_its_remainder():
    state = three_nodes()
    first = submit(state, now=T0, array="0-99", gpus_per_node=8)
    schedule(state, T0 + 1)
    for job_id in sorted(state.array_tasks[first]):
        state.apply(c.CancelJob(cmd_id(), T0 + 2, job_id))
    state.validate()
    assert {s for _, s in states(state, first)} == {"CANCELLED", "COMPLETING"}  # 3 ran
    assert state.remainders.holder == {} and state.waiting == {}
    assert not any(isinstance(e, Launch) for e in state.redo_effects())
    schedule(state, T0 + 3)


def test_a_requeued_task_waits_on_its_own_beside_the_remainder():
    state = three_nodes()
    first = submit(state, now=T0, array="0-9", gpus_per_node=8, requeue=True)
    schedule(state, T0 + 1)
    state.apply(c.RequeueJob(cmd_id(), T0 + 2, first + 1))
    job = state.jobs[first + 1]
    state.apply(c.JobFinished(cmd_id(), T0 + 3, first + 1, job.attempt, job.nodes[0], 0))
    state.validate()
    assert state.jobs[first + 1].state is JobState.PENDING
    assert state.jobs[first + 1].array_pending == ()
    assert state.jobs[first + 3].array_pending == tuple(range(first + 4, first + 10))
    plan, _ = schedule(state, T0 + 4)
    assert plan.allocate is not None
    # It was eligible later than the remainder's tasks: they go first.
    assert [p.job_id for p in plan.allocate.placements] == [first + 3]
