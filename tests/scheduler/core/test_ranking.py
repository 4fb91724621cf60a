"""The ranking kept between passes: its order, and what it keeps across commands."""

from __future__ import annotations

from scheduler.core.planner import plan_pass
from scheduler.core.priority import ranker
from scheduler.core.ranking import rank_key
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
