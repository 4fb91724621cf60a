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
