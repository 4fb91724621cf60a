"""The ranking kept between passes: its order, what it keeps across commands, and the
blocked jobs it keeps out of every pass."""

from __future__ import annotations

from scheduler.core import commands as c
from scheduler.core.jobs import Job
from scheduler.core.planner import plan_pass
from scheduler.core.priority import ranker
from scheduler.core.ranking import rank_key
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit


def test_of_two_jobs_alike_the_one_eligible_first_goes_first() -> None:
    state = cluster(gpu_node("n1"))
    later = submit(state, now=1000.0, gpus_per_node=8, begin_time=1500.0)  # lower id
    sooner = submit(state, now=1010.0, gpus_per_node=8, begin_time=1400.0)
    rank = ranker(state, 2000.0)
    # The same integer priority (100 s of age is a sixth of a point): the tie decides.
    assert rank.factors(state.jobs[later]).priority == rank.factors(state.jobs[sooner]).priority
    for full in (False, True):
        plan = plan_pass(state, now=2000.0, cmd_id=cmd_id(), full=full)
        assert plan.allocate is not None
        assert [p.job_id for p in plan.allocate.placements] == [sooner]
        assert dict(plan.allocate.reasons)[later] == "Resources"


def test_equal_priorities_go_by_eligible_time_then_job_id() -> None:
    state = cluster(gpu_node("n1"))
    first = submit(state, now=1000.0, gpus_per_node=1)
    second = submit(state, now=1000.0, gpus_per_node=1)
    rank = ranker(state, 1000.0)
    a, b = rank_key(rank, state.jobs[first]), rank_key(rank, state.jobs[second])
    assert a[0] == b[0] and a < b


def counted(state: ClusterState) -> list[int]:
    """The jobs a pass asks `blocked_reason` of, as they are asked."""
    asked: list[int] = []
    real = state.blocked_reason

    def blocked_reason(job: Job, now: float) -> str | None:
        asked.append(job.job_id)
        return real(job, now)

    state.blocked_reason = blocked_reason  # type: ignore[method-assign]
    return asked


def test_blocked_jobs_cost_a_pass_nothing_until_a_command_or_the_time_frees_them() -> None:
    state = cluster(gpu_node("n1"))
    held = [submit(state, now=1000.0, gpus_per_node=1, hold=True) for _ in range(200)]
    target = submit(state, now=1000.0, gpus_per_node=1)
    waiting = submit(state, now=1000.0, gpus_per_node=1, dependency=f"afterok:{target}")
    later = submit(state, now=1000.0, gpus_per_node=1, begin_time=1500.0)
    first = plan_pass(state, now=1001.0, cmd_id=cmd_id())
    assert first.allocate is not None
    assert [p.job_id for p in first.allocate.placements] == [target]
    state.apply(first.allocate)
    asked = counted(state)
    assert plan_pass(state, now=1002.0, cmd_id=cmd_id()).allocate is None
    assert asked == [waiting]  # what it waits on started (`after` would care)
    asked.clear()
    assert plan_pass(state, now=1002.0, cmd_id=cmd_id()).allocate is None
    assert asked == []  # 200 held, one dependent, one begin time: none looked at
    # A release re-reads that job alone; the next pass starts it.
    state.apply(c.ReleaseJob(cmd_id(), 1003.0, held[7]))
    plan = plan_pass(state, now=1004.0, cmd_id=cmd_id())
    assert asked == [held[7]]
    assert plan.allocate is not None and [p.job_id for p in plan.allocate.placements] == [held[7]]
    state.apply(plan.allocate)
    # The job a dependency names ends: the dependent is read again, and only it.
    asked.clear()
    job = state.jobs[target]
    state.apply(c.JobFinished(cmd_id(), 1005.0, target, job.attempt, "n1", 0))
    plan = plan_pass(state, now=1006.0, cmd_id=cmd_id())
    assert asked == [waiting]
    assert plan.allocate is not None and [p.job_id for p in plan.allocate.placements] == [waiting]
    state.apply(plan.allocate)
    # The begin time arrives with the pass's time.
    asked.clear()
    plan = plan_pass(state, now=1500.0, cmd_id=cmd_id())
    assert asked == [later]
    assert plan.allocate is not None and [p.job_id for p in plan.allocate.placements] == [later]


def test_a_dependency_that_fails_gives_its_reason_once_and_the_job_stays_out() -> None:
    state = cluster(gpu_node("n1"))
    target = submit(state, now=1000.0, gpus_per_node=8)
    dependent = submit(state, now=1000.0, gpus_per_node=1, dependency=f"afterok:{target}")
    plan = plan_pass(state, now=1001.0, cmd_id=cmd_id())
    assert plan.allocate is not None
    state.apply(plan.allocate)
    job = state.jobs[target]
    state.apply(c.JobFinished(cmd_id(), 1002.0, target, job.attempt, "n1", 1))
    plan = plan_pass(state, now=1003.0, cmd_id=cmd_id())
    assert plan.allocate is not None
    assert plan.allocate.reasons == ((dependent, "DependencyNeverSatisfied"),)
    # Until the state says so, each pass says it again (a plan may be lost).
    again = plan_pass(state, now=1004.0, cmd_id=cmd_id())
    assert again.allocate is not None and again.allocate.reasons == plan.allocate.reasons
    state.apply(again.allocate)
    assert state.jobs[dependent].reason == "DependencyNeverSatisfied"
    asked = counted(state)
    assert plan_pass(state, now=1005.0, cmd_id=cmd_id()).allocate is None
    assert asked == [dependent]  # its reason was set: a change, read once
    asked.clear()
    assert plan_pass(state, now=1006.0, cmd_id=cmd_id()).allocate is None
    assert asked == []


def test_a_pass_with_no_eligible_job_gives_reasons_without_a_free_map() -> None:
    """The pass after a job ends with nothing left to start (most of them, jobs coming
    one at a time) says only the blocked jobs' reasons: no free map is built for it."""
    state = cluster(gpu_node("n1"))
    target = submit(state, now=1000.0, gpus_per_node=8)
    dependent = submit(state, now=1000.0, gpus_per_node=1, dependency=f"afterok:{target}")
    plan = plan_pass(state, now=1001.0, cmd_id=cmd_id())
    assert plan.allocate is not None
    state.apply(plan.allocate)
    maps: list[object] = []
    real = state.free_map

    def free_map() -> object:
        maps.append(real())
        return maps[-1]

    state.free_map = free_map  # type: ignore[method-assign]
    job = state.jobs[target]
    state.apply(c.JobFinished(cmd_id(), 1002.0, target, job.attempt, "n1", 1))
    for full in (False, True):
        plan = plan_pass(state, now=1003.0, cmd_id=cmd_id(), full=full, estimate=True)
        assert plan.allocate is not None and not plan.allocate.placements
        assert plan.allocate.reasons == ((dependent, "DependencyNeverSatisfied"),)
        assert plan.estimated and plan.reservations == [] and plan.preempt == []
    assert maps == []
    state.apply(plan.allocate)
    assert plan_pass(state, now=1004.0, cmd_id=cmd_id()).allocate is None
    assert maps == []
