"""The kept ranking and the early stop change nothing: on random sequences of submits
(arrays, dependencies, holds, begin times among them), ends, cancels, holds, releases,
updates, preemptions and node changes, some naming one task of an array's pending
remainder, a pass on the ranking kept between passes (`ranking.py`) plans exactly what
a full pass from scratch plans (the same placements, reasons, preemptions and priority
factors; its reservations, with start estimates or without, the first of the full
pass's), and the kept index, blocked jobs and what they wait on included, is the one a
fresh build from the jobs gives. Start estimates change no decision of a pass."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.planner import Plan, plan_pass
from scheduler.core.policy import Account, Policy
from scheduler.core.ranking import PendingIndex
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import spec
from tests.scheduler.core.test_properties import NODES, SHAPES, Driver, job_op, other_op, submit_op

# Besides the shared operations: submits from several tenants with several time limits,
# nice values and node lists (so classes, groups and special jobs vary), and updates.
wide_submit = st.tuples(
    st.just("wide"),
    st.sampled_from(range(len(SHAPES))),
    st.sampled_from(["acme", "globex", "initech"]),
    st.sampled_from([None, 5, 30, 240]),
    st.sampled_from([0, 0, 50, 300]),
    st.sampled_from([(), (), ("n2",)]),
    st.integers(1, 10),  # how many alike
)
update_op = st.tuples(
    st.just("update"),
    st.integers(0, 50),
    st.sampled_from([("nice", 0), ("nice", 200), ("time_limit_min", 10), ("time_limit_min", 90)]),
)
# A check every so many jobs walked, after so long, with start estimates or without.
check_op = st.tuples(st.just("check"), st.integers(1, 4), st.floats(0, 4000), st.booleans())
ops = st.lists(
    st.one_of(
        submit_op,
        wide_submit,
        wide_submit,
        job_op,
        job_op,
        update_op,
        other_op,
        check_op,
        check_op,
        check_op,
    ),
    min_size=1,
    max_size=60,
)
policies = st.sampled_from(
    [
        None,
        Policy.of(backfill_depth=1),
        Policy.of(accounts=(Account(name="globex", shares=5),), backfill_depth=2),
        # Limits: every job is asked, no early stop; the ranking is still the kept one.
        Policy.of(accounts=(Account(name="acme", grp_gpus=8),)),
    ]
)


class Checker(Driver):
    def step(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "wide":
            self.now += 7.0
            _, shape, tenant, limit, nice, nodelist, count = op
            for _ in range(count):
                fields: dict[str, Any] = dict(SHAPES[shape], tenant=tenant, nice=nice)
                fields.update(time_limit_min=limit, nodelist=nodelist)
                if nodelist and SHAPES[shape].get("nodes", 1) > 1:
                    fields["nodelist"] = ()
                self.do(c.SubmitJob(self.cid(), self.now, spec(**fields)))
        elif kind == "update":
            self.now += 7.0
            job = self.pick(op[1], frozenset({JobState.PENDING}))
            if job is not None:
                self.do(c.UpdateJob(self.cid(), self.now, job.job_id, (op[2],), admin=True))
        elif kind == "check":
            # Plan at a later time (ages move on), stop as early as it may, compare, and
            # commit the kept pass's plan as the leader would.
            self.now += op[2]
            estimate = len(op) > 3 and op[3]
            kept = plan_pass(
                self.state, now=self.now, cmd_id="p", check_every=op[1], estimate=estimate
            )
            full = plan_pass(self.state, now=self.now, cmd_id="p", full=True, estimate=estimate)
            assert_same(kept, full)
            if estimate:
                # Estimates decide nothing: the pass without them plans the same, and its
                # reservations (made for a lower job) are the first of the estimates.
                plain = plan_pass(self.state, now=self.now, cmd_id="p", check_every=op[1])
                assert (plain.allocate, plain.preempt) == (kept.allocate, kept.preempt)
                assert plain.reservations == kept.reservations[: len(plain.reservations)]
            assert_index_fresh(self.state, self.now)
            if kept.allocate is not None:
                self.do(kept.allocate)
            self.do(kept.preempt[0] if kept.preempt else None)
        else:
            super().step(op)


def assert_same(kept: Plan, full: Plan) -> None:
    assert kept.allocate == full.allocate
    # Reservations are made when a lower job fits (only then can one be delayed); the
    # full pass walks on past where the kept one stopped, and may reserve for jobs that
    # no job after them could start beside: the kept ones are the first of its.
    assert kept.reservations == full.reservations[: len(kept.reservations)]
    assert kept.preempt == full.preempt
    assert dict(kept.factors) == dict(full.factors)


def assert_index_fresh(state: ClusterState, now: float) -> None:
    kept, fresh = state.ranking(now), PendingIndex.of(state, now)
    assert kept.classes == fresh.classes
    assert kept.entries == fresh.entries
    assert (kept.special, kept.unsettled) == (fresh.special, fresh.unsettled)
    assert (kept.shapes, kept.groups) == (fresh.shapes, fresh.groups)
    assert kept.holding.keys() == fresh.holding.keys()
    assert kept.accounts == fresh.accounts
    assert (kept.blocked, kept.misreasoned) == (fresh.blocked, fresh.misreasoned)
    assert (kept.dependents, kept.singletons) == (fresh.dependents, fresh.singletons)
    assert kept.throttled == fresh.throttled
    assert (kept.deadlines, kept._deadline) == (fresh.deadlines, fresh._deadline)
    assert kept.running_qos == fresh.running_qos
    # Every time a blocked job's reason may change with time is awaited (the kept heap
    # may also hold times that no longer matter).
    for job_id, at in fresh._wake_at.items():
        assert kept._wake_at.get(job_id) == at, f"job {job_id} is not woken at {at}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, policies)
def test_a_pass_on_the_kept_ranking_plans_what_a_full_pass_plans(
    operations: list[tuple[Any, ...]], policy: Policy | None
) -> None:
    checker = Checker()
    if policy is not None:
        checker.do(c.ConfigurePolicy(checker.cid(), checker.now, policy))
    checker.step(("check", 1, 0.0))  # the ranking exists from here on, kept by commands
    for op in operations:
        checker.step(op)
    checker.step(("check", 1, 1.0))


def test_a_pass_stops_early_once_the_rest_of_the_queue_cannot_start() -> None:
    checker = Checker()
    for _ in range(4):
        checker.step(("wide", 2, "acme", 30, 0, (), 6))  # 8 GPUs each: 3 nodes fill up
    kept = plan_pass(checker.state, now=checker.now, cmd_id="p", check_every=1)
    full = plan_pass(checker.state, now=checker.now, cmd_id="p", full=True)
    assert_same(kept, full)
    assert kept.allocate is not None and len(kept.allocate.placements) == len(NODES)
    checker.do(kept.allocate)
    # Steady state: the reasons are committed; a pass now has nothing to say.
    again = plan_pass(checker.state, now=checker.now + 1, cmd_id="q", check_every=1)
    assert again.allocate is None
    assert (
        again.allocate
        == plan_pass(checker.state, now=checker.now + 1, cmd_id="q", full=True).allocate
    )


def test_a_pass_passes_over_the_failed_jobs_behind_the_blocked_head() -> None:
    """Behind a blocked job with its reservation, a long run of jobs of a shape that
    failed (waiting on Priority already) and, far down, single GPUs waiting on Priority
    too that fit once a job ends: the kept pass passes over the run and starts what a
    full pass starts."""
    checker = Checker()
    checker.do(c.ConfigurePolicy(checker.cid(), checker.now, Policy.of(backfill_depth=1)))
    checker.step(("check", 1, 0.0))
    checker.step(("wide", 2, "acme", 30, 0, (), 2))  # 8 GPUs: two nodes full
    checker.step(("wide", 1, "acme", 30, 0, (), 2))  # 4 GPUs: the third full
    checker.step(("check", 1, 1.0))
    checker.step(("wide", 2, "acme", 60, 0, (), 1))  # blocked, reserved for
    checker.step(("wide", 0, "acme", 30, 0, (), 1))  # may fit beside it: the reservation
    checker.step(("wide", 2, "acme", 60, 300, (), 40))  # the run that fails
    checker.step(("wide", 0, "acme", 30, 50, (), 3))  # far down
    checker.step(("check", 1, 1.0))  # nothing starts: the reasons are committed
    assert {j.reason for j in checker.state.pending_jobs()} == {"Resources", "Priority"}
    four = next(
        j
        for j in checker.state.jobs.values()
        if j.state is JobState.RUNNING and j.spec.gpus_per_node == 4
    )
    checker.do(  # 4 GPUs free
        c.JobFinished(checker.cid(), checker.now, four.job_id, four.attempt, four.nodes[0], 0)
    )
    for every in (1, 4, 64):
        kept = plan_pass(checker.state, now=checker.now + 1, cmd_id="q", check_every=every)
        full = plan_pass(checker.state, now=checker.now + 1, cmd_id="q", full=True)
        assert_same(kept, full)
        assert kept.allocate is not None and len(kept.allocate.placements) == 4
