"""Backfill: lower jobs start early only when they do not delay reserved ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import commands as c
from scheduler.core.backfill import earliest_start, releases
from scheduler.core.contract import JobState
from scheduler.core.freemap import FreeMap
from scheduler.core.placement import place
from scheduler.core.planner import plan_pass
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit

T0 = 10_000.0


def run(state: ClusterState, now: float):
    plan = plan_pass(state, now=now, cmd_id=cmd_id())
    if plan.allocate is not None:
        state.apply(plan.allocate)
    state.validate()
    return plan


def test_a_short_job_backfills_beside_a_reservation_and_a_long_one_waits():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    busy = submit(state, now=T0, gpus_per_node=8, time_limit_min=60)
    run(state, T0)
    assert state.jobs[busy].state is JobState.RUNNING
    wide = submit(state, now=T0 + 1, nodes=2, gpus_per_node=8, time_limit_min=60)
    short = submit(state, now=T0 + 2, gpus_per_node=8, time_limit_min=30)
    long = submit(state, now=T0 + 3, gpus_per_node=8, time_limit_min=120)
    plan = run(state, T0 + 10)
    assert plan.reservations[0].job_id == wide
    assert plan.reservations[0].start == T0 + 3600
    assert state.jobs[short].state is JobState.RUNNING  # ends before the reservation
    assert state.jobs[long].state is JobState.PENDING
    assert (state.jobs[wide].reason, state.jobs[long].reason) == ("Resources", "Priority")


def test_a_job_without_a_time_limit_never_backfills_into_a_reservation():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    submit(state, now=T0, gpus_per_node=8, time_limit_min=60)
    run(state, T0)
    submit(state, now=T0 + 1, nodes=2, gpus_per_node=8, time_limit_min=60)
    forever = submit(state, now=T0 + 2, gpus_per_node=8)
    run(state, T0 + 10)
    assert state.jobs[forever].state is JobState.PENDING


def test_the_top_blocked_job_waits_on_resources_and_the_next_on_priority():
    state = cluster(gpu_node("sim01"))
    submit(state, now=T0, gpus_per_node=8)  # no limit: no reservation can be computed
    run(state, T0)
    first = submit(state, now=T0 + 1, gpus_per_node=8)
    second = submit(state, now=T0 + 2, gpus_per_node=8)
    run(state, T0 + 5)
    assert (state.jobs[first].reason, state.jobs[second].reason) == ("Resources", "Priority")


shapes = st.lists(
    st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([10, 30, 60, 120, 240])),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None)
@given(running=shapes, pending=shapes)
def test_backfill_never_delays_the_reserved_job(running, pending):
    state = cluster(gpu_node("a"), gpu_node("b"), gpu_node("c"))
    for gpus, limit in running:
        submit(state, now=T0, gpus_per_node=gpus, time_limit_min=limit)
    run(state, T0)
    # A job wider than any free space goes first, then the mix.
    submit(state, now=T0 + 1, nodes=2, gpus_per_node=8, time_limit_min=60)
    for gpus, limit in pending:
        submit(state, now=T0 + 2, gpus_per_node=gpus, time_limit_min=limit)
    now = T0 + 5
    plan = plan_pass(state, now=now, cmd_id=cmd_id())
    if plan.allocate is not None:
        state.apply(plan.allocate)
    state.validate()
    for before in plan.reservations:
        job = state.jobs[before.job_id]
        if job.state is not JobState.PENDING:
            continue
        after = earliest_start(
            job, FreeMap.of(state), releases(state, now), lambda j, f: place(state, j, f), now
        )
        assert after is not None and after <= before.start, (before, after)


def test_a_spot_job_yields_to_a_normal_job_that_needs_its_gpus():
    state = cluster(gpu_node("sim01"))
    spot = submit(state, now=T0, gpus_per_node=8, qos="spot")
    run(state, T0)
    urgent = submit(state, now=T0 + 1, gpus_per_node=8)
    bystander = submit(state, now=T0 + 2, gpus_per_node=8, qos="spot")
    plan = plan_pass(state, now=T0 + 2, cmd_id=cmd_id())
    assert [(p.job_ids, p.for_job) for p in plan.preempt] == [((spot,), urgent)]
    assert state.jobs[bystander].state is JobState.PENDING


def test_nothing_is_preempted_for_a_job_of_the_same_qos():
    state = cluster(gpu_node("sim01"))
    submit(state, now=T0, gpus_per_node=8)
    run(state, T0)
    submit(state, now=T0 + 1, gpus_per_node=8)
    assert plan_pass(state, now=T0 + 2, cmd_id=cmd_id()).preempt == []


def test_the_preempting_job_keeps_the_gpus_it_freed_and_the_victim_waits():
    state = cluster(gpu_node("sim01"))
    spot = submit(state, now=T0, gpus_per_node=8, qos="spot")
    run(state, T0)
    state.apply(c.JobStarted(cmd_id(), T0 + 1, spot, 1, "sim01", 4242))
    urgent = submit(state, now=T0 + 100, gpus_per_node=8)
    plan = plan_pass(state, now=T0 + 101, cmd_id=cmd_id())
    for command in plan.preempt:
        state.apply(command)
    state.apply(c.JobFinished(cmd_id(), T0 + 102, spot, 1, "sim01", 0, 15))
    assert state.jobs[spot].state is JobState.PENDING  # requeued
    run(state, T0 + 103)
    assert state.jobs[urgent].state is JobState.RUNNING
    assert state.jobs[spot].state is JobState.PENDING
    assert plan_pass(state, now=T0 + 104, cmd_id=cmd_id()).preempt == []


def test_a_job_never_preempts_one_that_outranks_it():
    from scheduler.core.policy import Policy, QoS

    state = cluster(gpu_node("sim01"))
    state.apply(
        c.ConfigurePolicy(
            cmd_id(),
            T0,
            Policy.of(qos=[QoS("normal", priority=0, preempt=("spot",)), QoS("spot", priority=50)]),
        )
    )
    submit(state, now=T0, gpus_per_node=8, qos="spot")
    run(state, T0)
    submit(state, now=T0 + 1, gpus_per_node=8)
    assert plan_pass(state, now=T0 + 2, cmd_id=cmd_id()).preempt == []


# -- start estimates (squeue --start) ------------------------------------------------------


def test_a_job_blocked_behind_a_running_job_is_expected_when_that_job_ends():
    state = cluster(gpu_node("sim01"))
    busy = submit(state, now=T0, gpus_per_node=8, time_limit_min=60)
    run(state, T0)
    waiting = submit(state, now=T0 + 1, gpus_per_node=8, time_limit_min=30)
    held = submit(state, now=T0 + 2, gpus_per_node=8, time_limit_min=30, hold=True)
    after = submit(state, now=T0 + 3, gpus=1, time_limit_min=30, dependency=f"afterok:{busy}")
    plan = plan_pass(state, now=T0 + 10, cmd_id=cmd_id(), estimate=True)
    assert plan.estimated
    assert [(r.job_id, r.start, r.nodes) for r in plan.reservations] == [
        (waiting, T0 + 3600, ["sim01"])
    ]
    # Held, or waiting on a dependency: whatever the resources, no start can be told.
    assert {held, after}.isdisjoint(r.job_id for r in plan.reservations)


def test_a_pass_reserves_only_for_a_lower_job_unless_asked_for_estimates():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    submit(state, now=T0, gpus_per_node=8, time_limit_min=60)
    submit(state, now=T0, gpus_per_node=8, time_limit_min=90)
    run(state, T0)
    first = submit(state, now=T0 + 1, gpus_per_node=8, time_limit_min=30)
    second = submit(state, now=T0 + 2, gpus_per_node=4, time_limit_min=30)
    plain = plan_pass(state, now=T0 + 10, cmd_id="p")
    estimated = plan_pass(state, now=T0 + 10, cmd_id="p", estimate=True)
    # Nothing fits now, so nothing asked for the timeline: the plain pass built none.
    assert (plain.reservations, plain.estimated) == ([], False)
    # The first takes the node freed first for good (a reservation holds on), so the
    # second is expected when the other one frees.
    assert [(r.job_id, r.start) for r in estimated.reservations] == [
        (first, T0 + 3600),
        (second, T0 + 5400),
    ]
    # The estimates decide nothing: the same reasons, placements, preemptions, factors.
    assert (estimated.allocate, estimated.preempt) == (plain.allocate, plain.preempt)
    assert dict(estimated.factors) == dict(plain.factors)


def test_a_gang_is_expected_once_each_of_its_nodes_is_free_and_names_them_in_order():
    state = cluster(gpu_node("sim02"), gpu_node("sim01"), gpu_node("sim03"))
    for limit in (30, 90, 120):
        submit(state, now=T0, gpus_per_node=8, time_limit_min=limit)
    run(state, T0)
    wide = submit(state, now=T0 + 1, nodes=2, gpus_per_node=8, time_limit_min=60)
    plan = plan_pass(state, now=T0 + 10, cmd_id=cmd_id(), estimate=True)
    (reserved,) = plan.reservations
    assert reserved.job_id == wide
    assert reserved.start == T0 + 90 * 60  # the second node to free up
    ends = {
        name: job.start_time + job.time_limit_min * 60  # type: ignore[operator]
        for job in state.jobs.values()
        if job.state is JobState.RUNNING
        for name in job.allocation
    }
    assert reserved.nodes == sorted(n for n, end in ends.items() if end <= T0 + 90 * 60)


def test_a_job_without_a_limit_ahead_leaves_the_one_behind_without_an_estimate():
    state = cluster(gpu_node("sim01"))
    submit(state, now=T0, gpus_per_node=8)  # runs for ever, as far as anyone knows
    run(state, T0)
    submit(state, now=T0 + 1, gpus_per_node=8, time_limit_min=30)
    assert plan_pass(state, now=T0 + 10, cmd_id=cmd_id(), estimate=True).reservations == []


@settings(max_examples=60, deadline=None)
@given(running=shapes, pending=shapes)
def test_an_estimate_never_promises_a_start_before_the_job_can_fit(running, pending):
    state = cluster(gpu_node("a"), gpu_node("b"), gpu_node("c"))
    for gpus, limit in running:
        submit(state, now=T0, gpus_per_node=gpus, time_limit_min=limit)
    run(state, T0)
    for gpus, limit in pending:
        submit(state, now=T0 + 2, gpus_per_node=gpus, time_limit_min=limit)
    now = T0 + 5
    plan = plan_pass(state, now=now, cmd_id=cmd_id(), estimate=True)
    placed = {p.job_id for p in plan.allocate.placements} if plan.allocate else set()
    assert placed.isdisjoint(r.job_id for r in plan.reservations)
    # With nothing of this pass started and nothing else reserved, the exact search over
    # the releases says when a job fits at the earliest: an estimate is never sooner.
    for reserved in plan.reservations:
        job = state.jobs[reserved.job_id]
        exact = earliest_start(
            job, FreeMap.of(state), releases(state, now), lambda j, f: place(state, j, f), now
        )
        assert exact is not None and reserved.start >= exact, (reserved, exact)
