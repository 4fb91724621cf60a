"""Job lifecycle: arrays, dependencies, holds, begin times, requeue, preemption, usage."""

from __future__ import annotations

import pickle

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.effects import Emit, Signal
from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.core.freemap import FreeMap
from scheduler.core.placement import place
from scheduler.core.policy import Account, Policy, QoS
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, spec, submit

T0 = 1000.0


def start(state: ClusterState, job_id: int, now: float = T0 + 10) -> bool:
    job = state.job(job_id)
    where = place(state, job, FreeMap.of(state))
    assert where is not None, f"job {job_id} does not fit"
    state.apply(c.Allocate(cmd_id(), now, (c.Placement(job_id, where),)))
    state.validate()
    return state.job(job_id).state is JobState.RUNNING


def finish(state: ClusterState, job_id: int, exit_code: int = 0, now: float = T0 + 20) -> None:
    job = state.jobs[job_id]
    state.apply(c.JobFinished(cmd_id(), now, job_id, job.attempt, job.nodes[0], exit_code))
    state.validate()


def two_nodes() -> ClusterState:
    return cluster(gpu_node("n1"), gpu_node("n2"), now=T0)


# -- submit-time refusals ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"qos": "gold"}, "Invalid qos specification"),
        ({"account": "elsewhere"}, "Invalid account"),
        ({"dependency": "afterok:99"}, "job 99 is unknown"),
    ],
)
def test_it_refuses_a_submission_that_can_never_be_valid(fields: dict[str, str], message: str):
    state = two_nodes()
    submit(state, now=T0)
    before = state.to_bytes()
    with pytest.raises(Rejected, match=message):
        submit(state, **fields)
    assert state.to_bytes() == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dependency": "afterok"}, "Job dependency problem"),
        ({"dependency": "afterwards:1"}, "Job dependency problem"),
        ({"dependency": "afterok:1,afterany:1?afterok:1"}, "cannot be mixed"),
        ({"array": "3-1"}, "Invalid job array specification"),
        ({"array": "0-2000"}, "Invalid job array specification"),
        ({"array": "0-100000000"}, "Invalid job array specification"),
        ({"array": "0-3%0"}, "Invalid job array specification"),
        ({"array": "x"}, "Invalid job array specification"),
    ],
)
def test_a_malformed_array_or_dependency_is_refused_before_it_reaches_the_state(
    fields: dict[str, str], message: str
):
    with pytest.raises(InvalidSpec, match=message) as refused:
        spec(**fields)
    assert refused.value.field in fields


def test_a_tenant_may_use_its_own_account_and_configured_ones():
    state = two_nodes()
    state.apply(c.ConfigurePolicy(cmd_id(), T0, Policy.of(accounts=[Account("ml", shares=4)])))
    assert state.jobs[submit(state, account="acme")].account == "acme"
    assert state.jobs[submit(state, account="ml")].account == "ml"


# -- arrays ---------------------------------------------------------------------------------


def test_an_array_submission_is_one_record_and_one_event_each_task_keeps_its_job_id():
    state = two_nodes()
    submit(state, now=T0)
    before = state.seq
    first = submit(state, array="0,6,16-18", name="arr")
    assert state.seq == before + 1  # one event, not one per task
    assert [j.job_id for j in state.jobs.values() if j.array_job_id == first] == [first]
    rest = state.jobs[first]
    assert rest.array_pending == (first + 1, first + 2, first + 3, first + 4)
    assert rest.display_id == f"{first}_[0,6,16-18]"
    assert (rest.to_dict()["array_task_id"], rest.to_dict()["array_tasks"]) == (None, "0,6,16-18")
    # Readers list every task, with the job id it always had.
    tasks = list(state.listed())[1:]
    assert [(j.job_id, j.array_task_id) for j in tasks] == [
        (first, 0),
        (first + 1, 6),
        (first + 2, 16),
        (first + 3, 17),
        (first + 4, 18),
    ]
    assert [j.display_id for j in tasks][:2] == [f"{first}_0", f"{first}_6"]
    assert [t.to_dict()["array_tasks"] for t in tasks] == [""] * 5
    assert state.job(first + 2).array_task_id == 16
    assert state.next_job_id == first + 5
    assert state.waiting == {"acme": 6}
    state.validate()


def test_a_task_named_by_a_command_leaves_the_remainder_which_stands_for_the_rest():
    state = two_nodes()
    first = submit(state, array="0-4", gpus_per_node=1)
    seq = state.seq
    effects = state.apply(c.HoldJob(cmd_id(), T0 + 1, first + 2))
    held = state.jobs[first + 2]
    assert (held.array_task_id, held.hold, held.reason) == (2, "user", "JobHeldUser")
    assert state.jobs[first].array_pending == (first + 1, first + 3, first + 4)
    assert state.jobs[first].reason == "None"
    # The task's events (it left, it was held), then the remainder's once.
    emitted = [(e.job_id, e.kind) for e in effects if isinstance(e, Emit)]
    assert emitted == [(first + 2, "held"), (first + 2, "split"), (first, "remainder")]
    assert state.seq == seq + 3
    remainder = next(e for e in effects if isinstance(e, Emit) and e.kind == "remainder")
    assert remainder.job["array_tasks"] == "0-1,3-4"
    # Starting its own task moves the remainder on to the next one.
    assert start(state, first)
    assert first not in state.remainders.holder.values()
    assert state.jobs[first + 1].array_pending == (first + 3, first + 4)
    assert state.jobs[first].array_pending == () and state.jobs[first].array_task_id == 0
    # A refused command changes nothing, a remainder's task included.
    before = state.to_bytes()
    with pytest.raises(Rejected):
        state.apply(c.RequeueJob(cmd_id(), T0 + 12, first + 3))
    with pytest.raises(Rejected):
        state.apply(c.SuspendJob(cmd_id(), T0 + 12, first + 3, admin=True))
    assert state.apply(c.ReleaseJob(cmd_id(), T0 + 12, first + 3)) == []
    assert state.to_bytes() == before
    # Cancelling the last ones leaves nothing pending behind.
    for job_id in (first + 4, first + 3, first + 1, first + 2):
        state.apply(c.CancelJob(cmd_id(), T0 + 13, job_id))
        state.validate()
    assert all(j.state is JobState.CANCELLED for j in state.jobs.values() if j.job_id != first)
    assert state.remainders.holder == {} and state.waiting == {}


def test_an_array_step_and_a_retried_submit_make_no_extra_tasks():
    state = two_nodes()
    first = submit(state, key="same", array="0-15:4")
    submit(state, key="same", array="0-15:4")
    assert [state.job(j).array_task_id for j in state.array_tasks[first]] == [0, 4, 8, 12]
    assert len(state.jobs) == 1 and len(list(state.listed())) == 4


def test_the_array_throttle_holds_tasks_back_with_job_array_task_limit():
    state = two_nodes()
    first = submit(state, array="0-3%2", gpus_per_node=1)
    assert start(state, first) and start(state, first + 1)
    assert state.blocked_reason(state.jobs[first + 2], T0 + 11) == "JobArrayTaskLimit"
    assert not start(state, first + 2)
    assert state.jobs[first + 2].reason == "JobArrayTaskLimit"
    assert state.jobs[first + 2].array_pending == (first + 3,)  # still the remainder
    finish(state, first)
    assert state.blocked_reason(state.jobs[first + 2], T0 + 21) is None
    assert start(state, first + 2, now=T0 + 21)


def test_one_plan_cannot_pass_the_throttle_with_several_tasks():
    state = two_nodes()
    first = submit(state, array="0-3%1", gpus_per_node=1)
    free = FreeMap.of(state)
    placements = []
    for job_id in (first, first + 1):
        where = place(state, state.job(job_id), free)
        assert where is not None
        free.take(where)
        placements.append(c.Placement(job_id, where))
    state.apply(c.Allocate(cmd_id(), T0 + 5, tuple(placements)))
    state.validate()
    assert state.jobs[first].state is JobState.RUNNING
    assert state.jobs[first + 1].state is JobState.PENDING
    assert state.jobs[first + 1].reason == "JobArrayTaskLimit"


# -- dependencies -------------------------------------------------------------------------


def test_afterok_waits_then_starts_after_success():
    state = two_nodes()
    a = submit(state)
    b = submit(state, dependency=f"afterok:{a}")
    assert state.jobs[b].reason == "Dependency"
    assert state.job_dict(state.jobs[b], T0)["dependency"] == f"afterok:{a}(unfulfilled)"
    start(state, a)
    finish(state, a)
    assert state.blocked_reason(state.jobs[b], T0 + 30) is None
    assert state.job_dict(state.jobs[b], T0)["dependency"] == "(null)"


def test_afterok_on_a_failed_job_is_never_satisfied_and_the_job_stays_pending():
    state = two_nodes()
    a = submit(state)
    b = submit(state, dependency=f"afterok:{a}")
    start(state, a)
    finish(state, a, exit_code=1)
    assert state.blocked_reason(state.jobs[b], T0 + 30) == "DependencyNeverSatisfied"
    assert state.job_dict(state.jobs[b], T0)["dependency"] == f"afterok:{a}(failed)"
    assert state.jobs[b].state is JobState.PENDING


@pytest.mark.parametrize(
    ("kind", "exit_code", "expected"),
    [
        ("afternotok", 0, "DependencyNeverSatisfied"),
        ("afternotok", 3, None),
        ("afterany", 3, None),
        ("afterany", 0, None),
        ("after", 0, None),
    ],
)
def test_each_dependency_kind_after_the_job_ends(kind: str, exit_code: int, expected: str | None):
    state = two_nodes()
    a = submit(state)
    b = submit(state, dependency=f"{kind}:{a}")
    start(state, a)
    finish(state, a, exit_code=exit_code)
    assert state.blocked_reason(state.jobs[b], T0 + 30) == expected


def test_after_is_met_once_the_job_started_plus_its_delay():
    state = two_nodes()
    a = submit(state)
    b = submit(state, dependency=f"after:{a}")
    d = submit(state, dependency=f"after:{a}+5")
    assert state.blocked_reason(state.jobs[b], T0 + 5) == "Dependency"
    start(state, a, now=T0 + 10)
    assert state.blocked_reason(state.jobs[b], T0 + 11) is None
    assert state.blocked_reason(state.jobs[d], T0 + 11) == "Dependency"
    assert state.blocked_reason(state.jobs[d], T0 + 10 + 300) is None


def test_or_dependencies_need_one_and_and_dependencies_need_all():
    state = two_nodes()
    a, b = submit(state), submit(state)
    either = submit(state, dependency=f"afterok:{a}?afterok:{b}")
    both = submit(state, dependency=f"afterok:{a},afterok:{b}")
    start(state, a)
    finish(state, a, exit_code=1)
    assert state.blocked_reason(state.jobs[either], T0 + 30) == "Dependency"
    assert state.blocked_reason(state.jobs[both], T0 + 30) == "DependencyNeverSatisfied"
    start(state, b, now=T0 + 30)
    finish(state, b, now=T0 + 40)
    assert state.blocked_reason(state.jobs[either], T0 + 50) is None


def test_a_dependency_on_an_array_waits_for_every_task_and_aftercorr_for_its_own():
    state = two_nodes()
    arr = submit(state, array="0-1", gpus_per_node=1)
    whole = submit(state, dependency=f"afterok:{arr}")
    one = submit(state, dependency=f"afterok:{arr}_1")
    corr = submit(state, array="0-1", dependency=f"aftercorr:{arr}")
    start(state, arr + 1)
    finish(state, arr + 1)
    assert state.blocked_reason(state.jobs[whole], T0 + 30) == "Dependency"
    assert state.blocked_reason(state.jobs[one], T0 + 30) is None
    assert state.blocked_reason(state.jobs[corr], T0 + 30) == "Dependency"  # task 0
    assert state.blocked_reason(state.jobs[corr + 1], T0 + 30) is None  # task 1
    # A dependency on one task names it: that task left its remainder; aftercorr's
    # tasks each wait on their own, so they are jobs of their own from the start.
    assert state.jobs[arr + 1].array_pending == () and arr + 1 in state.jobs
    assert state.jobs[corr].array_pending == () and corr + 1 in state.jobs


def test_singleton_waits_for_earlier_jobs_of_the_same_name_and_user():
    state = two_nodes()
    a = submit(state, name="train")
    b = submit(state, name="train", dependency="singleton")
    other = submit(state, name="train", user="bob", dependency="singleton")
    assert state.blocked_reason(state.jobs[b], T0) == "Dependency"
    assert state.blocked_reason(state.jobs[other], T0) is None
    start(state, a)
    finish(state, a)
    assert state.blocked_reason(state.jobs[b], T0 + 30) is None


def test_purging_spares_jobs_that_a_pending_job_depends_on():
    state = two_nodes()
    a = submit(state)
    b = submit(state, dependency=f"afternotok:{a}")
    start(state, a)
    finish(state, a)
    state.apply(c.PurgeJobs(cmd_id(), T0 + 1000, ended_before=T0 + 999))
    assert a in state.jobs
    state.apply(c.CancelJob(cmd_id(), T0 + 1001, b))
    state.apply(c.PurgeJobs(cmd_id(), T0 + 2000, ended_before=T0 + 1999))
    assert a not in state.jobs and b not in state.jobs
    state.validate()


# -- holds and begin times --------------------------------------------------------------


def test_a_job_submitted_held_waits_until_released():
    state = two_nodes()
    a = submit(state, hold=True)
    assert state.jobs[a].reason == "JobHeldUser"
    assert state.jobs[a].to_dict()["held"] is True
    assert not start(state, a)
    state.apply(c.ReleaseJob(cmd_id(), T0 + 11, a))
    assert state.jobs[a].reason == "None"
    assert start(state, a, now=T0 + 12)


def test_an_admin_hold_is_released_only_by_an_admin():
    state = two_nodes()
    a = submit(state)
    state.apply(c.HoldJob(cmd_id(), T0 + 1, a, admin=True))
    state.apply(c.HoldJob(cmd_id(), T0 + 2, a))  # a user hold does not weaken it
    assert state.blocked_reason(state.jobs[a], T0 + 3) == "JobHeldAdmin"
    with pytest.raises(Rejected, match="permission"):
        state.apply(c.ReleaseJob(cmd_id(), T0 + 3, a))
    state.apply(c.ReleaseJob(cmd_id(), T0 + 4, a, admin=True))
    assert state.blocked_reason(state.jobs[a], T0 + 4) is None


def test_only_pending_jobs_can_be_held():
    state = two_nodes()
    a = submit(state)
    start(state, a)
    with pytest.raises(Rejected, match="no longer pending"):
        state.apply(c.HoldJob(cmd_id(), T0 + 11, a))


def test_a_begin_time_in_the_future_keeps_the_job_pending():
    state = two_nodes()
    a = submit(state, begin_time=T0 + 3600)
    assert state.jobs[a].reason == "BeginTime"
    assert state.jobs[a].eligible_time == T0 + 3600
    assert not start(state, a)
    assert start(state, a, now=T0 + 3600)


# -- requeue and preemption ----------------------------------------------------------------


def test_requeue_stops_the_job_and_puts_it_back_in_the_queue():
    state = two_nodes()
    a = submit(state, gpus_per_node=2)
    start(state, a)
    effects = state.apply(c.RequeueJob(cmd_id(), T0 + 15, a, hold=True))
    assert any(isinstance(e, Signal) and e.signal == 15 and e.escalate for e in effects)
    assert state.jobs[a].state is JobState.COMPLETING
    finish(state, a, exit_code=0, now=T0 + 16)
    job = state.jobs[a]
    assert job.state is JobState.PENDING and not job.allocation and job.attempt == 1
    assert job.reason == "JobHeldUser"
    state.apply(c.ReleaseJob(cmd_id(), T0 + 17, a))
    start(state, a, now=T0 + 18)
    assert state.jobs[a].attempt == 2


def preemptible_cluster() -> tuple[ClusterState, int, int]:
    state = cluster(gpu_node("n1", gpus=2), now=T0)
    spot = submit(state, qos="spot", gpus_per_node=2)
    start(state, spot)
    urgent = submit(state, gpus_per_node=2)
    return state, spot, urgent


def test_preemption_terms_with_the_grace_time_then_requeues():
    state, spot, urgent = preemptible_cluster()
    effects = state.apply(c.Preempt(cmd_id(), T0 + 30, (spot,), for_job=urgent))
    signals = [e for e in effects if isinstance(e, Signal)]
    assert [(s.signal, s.escalate, s.grace_s) for s in signals] == [(15, True, 30.0)]
    finish(state, spot, exit_code=0, now=T0 + 40)
    assert state.jobs[spot].state is JobState.PENDING
    assert start(state, urgent, now=T0 + 41)


def test_preemption_in_cancel_mode_ends_the_job_preempted():
    state = cluster(gpu_node("n1", gpus=2), now=T0)
    policy = Policy.of(
        [QoS("normal", preempt=("spot",)), QoS("spot", preempt_mode="cancel", grace_s=5)]
    )
    state.apply(c.ConfigurePolicy(cmd_id(), T0, policy))
    spot = submit(state, qos="spot", gpus_per_node=2)
    start(state, spot)
    urgent = submit(state, gpus_per_node=2)
    state.apply(c.Preempt(cmd_id(), T0 + 30, (spot,), for_job=urgent))
    finish(state, spot, exit_code=0, now=T0 + 40)
    assert state.jobs[spot].state is JobState.PREEMPTED
    assert state.jobs[spot].to_dict()["state"] == "PREEMPTED"


def test_a_job_may_not_preempt_one_its_qos_does_not_list():
    state = cluster(gpu_node("n1", gpus=2), now=T0)
    normal = submit(state, gpus_per_node=2)
    start(state, normal)
    other = submit(state, qos="spot", gpus_per_node=2)
    before = state.to_bytes()
    with pytest.raises(Rejected, match="may not preempt"):
        state.apply(c.Preempt(cmd_id(), T0 + 30, (normal,), for_job=other))
    assert state.to_bytes() == before


def test_a_stale_preemption_changes_nothing():
    state, spot, urgent = preemptible_cluster()
    state.apply(c.CancelJob(cmd_id(), T0 + 20, urgent))
    before = state.to_bytes()
    assert state.apply(c.Preempt(cmd_id(), T0 + 30, (spot,), for_job=urgent)) == []
    assert state.to_bytes() == before


def test_a_higher_partition_tier_preempts_a_lower_one_with_a_preempt_mode():
    parts = (
        c.PartitionDef("low", default=True, priority_tier=1, preempt_mode="cancel"),
        c.PartitionDef("high", priority_tier=2),
    )
    state = cluster(gpu_node("n1", gpus=2), partitions=parts, now=T0)
    low = submit(state, gpus_per_node=2)
    start(state, low)
    high = submit(state, partition="high", gpus_per_node=2)
    state.apply(c.Preempt(cmd_id(), T0 + 30, (low,), for_job=high))
    finish(state, low, now=T0 + 31)
    assert state.jobs[low].state is JobState.PREEMPTED


def test_cancelling_a_job_being_requeued_keeps_it_down():
    state, spot, urgent = preemptible_cluster()
    state.apply(c.Preempt(cmd_id(), T0 + 30, (spot,), for_job=urgent))
    state.apply(c.CancelJob(cmd_id(), T0 + 31, spot))
    finish(state, spot, now=T0 + 32)
    assert state.jobs[spot].state is JobState.CANCELLED


# -- fair-share usage ------------------------------------------------------------------------


def test_usage_counts_gpu_seconds_and_halves_every_half_life():
    state = two_nodes()
    half_life = state.policy.fairshare_half_life_s
    a = submit(state, gpus_per_node=4)
    start(state, a, now=T0 + 10)
    finish(state, a, now=T0 + 110)
    assert state.usage("acme", T0 + 110) == pytest.approx(400.0)
    assert state.usage("acme", T0 + 110 + half_life) == pytest.approx(200.0)
    assert state.usage("other", T0) == 0.0


def test_usage_survives_a_snapshot_byte_for_byte():
    state, spot, urgent = preemptible_cluster()
    state.apply(c.Preempt(cmd_id(), T0 + 30, (spot,), for_job=urgent))
    finish(state, spot, now=T0 + 40)
    copy = pickle.loads(pickle.dumps(state))
    assert copy.to_bytes() == state.to_bytes()
    assert copy.usage("acme", T0 + 50) == state.usage("acme", T0 + 50) > 0
    copy.apply(c.HoldJob(cmd_id(), T0 + 60, spot))  # the handler table came back
    copy.validate()


def test_a_dependency_on_another_organisations_job_is_refused_like_an_unknown_one():
    state = two_nodes()
    theirs = submit(state, now=T0, tenant="globex")
    before = state.to_bytes()
    with pytest.raises(Rejected) as foreign:
        submit(state, dependency=f"afterok:{theirs}")
    with pytest.raises(Rejected) as unknown:
        submit(state, dependency="afterok:999")
    assert foreign.value.message == unknown.value.message.replace("999", str(theirs))
    assert foreign.value.code == unknown.value.code == "invalid_dependency"
    assert state.to_bytes() == before
    mine = submit(state, now=T0)
    assert state.jobs[submit(state, dependency=f"afterok:{mine}")].depends is not None


def test_an_organisation_may_have_only_so_many_jobs_waiting():
    state = two_nodes()
    state.apply(
        c.ConfigurePolicy(
            cmd_id(), T0, Policy(account_defaults=Account(name="", max_submit_jobs=3))
        )
    )
    first = submit(state, now=T0, hold=True)
    submit(state, now=T0, hold=True)
    before = state.to_bytes()
    with pytest.raises(Rejected) as refused:
        submit(state, array="0-1", hold=True)  # two tasks: one too many
    assert refused.value.code == "AssocMaxSubmitJobLimit"
    assert "account acme may have 3 jobs waiting and has 2" in refused.value.message
    assert state.to_bytes() == before
    submit(state, hold=True, tenant="globex")  # another organisation counts apart
    state.apply(c.CancelJob(cmd_id(), T0 + 1, first))  # one fewer waiting: room again
    submit(state, hold=True)
    state.validate()
    assert pickle.loads(pickle.dumps(state)).waiting == state.waiting


def test_a_job_larger_than_its_organisations_gpu_cap_is_refused_at_submit():
    state = two_nodes()
    state.apply(
        c.ConfigurePolicy(cmd_id(), T0, Policy(account_defaults=Account(name="", grp_gpus=4)))
    )
    with pytest.raises(Rejected) as refused:
        submit(state, gpus_per_node=8)
    assert refused.value.code == "AssocGrpGRES"
    assert "8 GPUs asked, account acme may hold 4" in refused.value.message
    assert state.jobs[submit(state, gpus_per_node=4)].shape.resources.gpus == 4
