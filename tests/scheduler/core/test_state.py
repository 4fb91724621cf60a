from __future__ import annotations

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.effects import Emit, Launch, Signal
from scheduler.core.errors import Rejected
from scheduler.core.planner import plan
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit
from tests.scheduler.core.factories import spec as submit_spec


def schedule(state: ClusterState, now: float = 1002.0) -> list:
    allocate = plan(state, now=now, cmd_id=cmd_id())
    effects = state.apply(allocate) if allocate else []
    state.validate()
    return effects


def test_a_submitted_job_is_pending_with_the_next_id():
    state = cluster(gpu_node("sim01"))
    first = submit(state)
    second = submit(state)
    assert (first, second) == (1, 2)
    assert state.jobs[1].state is JobState.PENDING
    assert state.jobs[1].partition == "gpu"
    assert state.jobs[1].account == "acme"
    state.validate()


def test_a_retried_submission_returns_the_same_job():
    state = cluster(gpu_node("sim01"))
    first = submit(state, key="same-key")
    again = submit(state, key="same-key")
    assert first == again
    assert len(state.jobs) == 1


def test_it_places_a_two_gpu_job_on_exact_free_indices():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state, gpus_per_node=2)
    effects = schedule(state)
    job = state.jobs[job_id]
    assert job.state is JobState.RUNNING
    assert job.allocation["sim01"].gpus == (0, 1)
    launch = [e for e in effects if isinstance(e, Launch)]
    assert [(e.job_id, e.attempt, e.node) for e in launch] == [(job_id, 1, "sim01")]
    assert launch[0].job["allocation"]["sim01"]["gpus"] == [0, 1]
    assert launch[0].job["spec"]["script"].startswith("#!/bin/sh")


def test_jobs_that_do_not_fit_wait_for_resources_and_start_when_gpus_free():
    state = cluster(gpu_node("sim01"))
    ids = [submit(state, gpus_per_node=4) for _ in range(3)]
    schedule(state)
    assert [state.jobs[i].state for i in ids] == [
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.PENDING,
    ]
    assert state.jobs[ids[2]].reason == "Resources"
    state.apply(c.JobStarted(cmd_id(), 1003.0, ids[0], 1, "sim01", 4242))
    state.apply(c.JobFinished(cmd_id(), 1004.0, ids[0], 1, "sim01", 0, 0))
    state.validate()
    assert state.jobs[ids[0]].state is JobState.COMPLETED
    schedule(state, now=1005.0)
    assert state.jobs[ids[2]].state is JobState.RUNNING
    assert state.jobs[ids[2]].allocation["sim01"].gpus == (0, 1, 2, 3)


def test_a_nonzero_exit_ends_the_job_failed_with_its_code():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state)
    schedule(state)
    effects = state.apply(c.JobFinished(cmd_id(), 1003.0, job_id, 1, "sim01", 3, 0))
    job = state.jobs[job_id]
    assert (job.state, job.exit_code, job.signal) == (JobState.FAILED, 3, 0)
    assert [e.kind for e in effects if isinstance(e, Emit)] == ["finished"]
    state.validate()


def test_cancelling_a_running_job_signals_it_and_holds_gpus_until_it_is_gone():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state, gpus_per_node=8)
    schedule(state)
    effects = state.apply(c.CancelJob(cmd_id(), 1003.0, job_id, by="alice"))
    signals = [e for e in effects if isinstance(e, Signal)]
    assert [(s.node, s.signal, s.escalate) for s in signals] == [("sim01", 15, True)]
    assert state.jobs[job_id].state is JobState.COMPLETING
    assert state.nodes["sim01"].free_gpus() == []
    state.apply(c.JobFinished(cmd_id(), 1004.0, job_id, 1, "sim01", 0, 15))
    job = state.jobs[job_id]
    assert (job.state, job.signal) == (JobState.CANCELLED, 15)
    assert len(state.nodes["sim01"].free_gpus()) == 8
    state.validate()


def test_cancelling_a_pending_job_ends_it_at_once():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state)
    effects = state.apply(c.CancelJob(cmd_id(), 1003.0, job_id))
    assert state.jobs[job_id].state is JobState.CANCELLED
    assert not [e for e in effects if isinstance(e, Signal)]


def test_cancelling_twice_or_a_finished_job_changes_nothing():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state)
    state.apply(c.CancelJob(cmd_id(), 1003.0, job_id))
    before = state.to_bytes()
    assert state.apply(c.CancelJob(cmd_id(), 1004.0, job_id)) == []
    assert state.to_bytes() == before


def test_cancelling_an_unknown_job_is_refused():
    state = cluster(gpu_node("sim01"))
    with pytest.raises(Rejected, match="Invalid job id"):
        state.apply(c.CancelJob(cmd_id(), 1003.0, 99))


def test_a_stale_report_from_an_earlier_attempt_is_ignored():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state)
    schedule(state)
    before = state.to_bytes()
    assert state.apply(c.JobFinished(cmd_id(), 1003.0, job_id, 7, "sim01", 1, 0)) == []
    assert state.apply(c.JobStarted(cmd_id(), 1003.0, 999, 1, "sim01", 1)) == []
    assert state.to_bytes() == before


def test_a_stale_plan_is_not_applied_twice():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state, gpus_per_node=8)
    allocate = plan(state, now=1002.0, cmd_id=cmd_id())
    assert allocate is not None
    state.apply(allocate)
    assert state.apply(allocate) == []
    assert state.jobs[job_id].attempt == 1
    state.validate()


def test_a_plan_for_gpus_taken_meanwhile_is_dropped():
    state = cluster(gpu_node("sim01"))
    first = submit(state, gpus_per_node=8)
    second = submit(state, gpus_per_node=8)
    stale = plan(state, now=1002.0, cmd_id=cmd_id())
    assert stale is not None and [p.job_id for p in stale.placements] == [first]
    state.apply(c.CancelJob(cmd_id(), 1002.5, first))
    forged = c.Allocate(
        cmd_id(), 1003.0, placements=(c.Placement(second, stale.placements[0].nodes),)
    )
    state.apply(forged)
    state.validate()
    assert state.jobs[second].state is JobState.RUNNING
    assert state.apply(c.Allocate(cmd_id(), 1004.0, placements=stale.placements)) == []
    state.validate()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus_per_node": 9}, "9 GPUs per node requested, the largest node has 8"),
        ({"gpus_per_node": 1, "gpu_type": "h200"}, "unknown GPU type 'h200'"),
        ({"cpus_per_task": 65}, "65 CPUs per node requested"),
        ({"mem_per_node_mb": 600 * 1024}, "memory per node requested"),
        ({"nodes": 3}, "3 nodes requested, partition gpu has 2"),
    ],
)
def test_a_request_larger_than_the_cluster_is_refused_at_submit(kwargs, message):
    state = cluster(gpu_node("sim01"), gpu_node("sim02", model="h100"))
    before = state.to_bytes()
    with pytest.raises(Rejected) as err:
        submit(state, **kwargs)
    assert "Requested node configuration is not available" in err.value.message
    assert message in err.value.message
    assert state.to_bytes() == before


def test_a_gpu_type_is_matched_by_model():
    state = cluster(gpu_node("sim01"), gpu_node("sim02", model="h100"))
    job_id = submit(state, gpus_per_node=2, gpu_type="h100")
    schedule(state)
    assert state.jobs[job_id].nodes == ("sim02",)


def test_an_unknown_partition_is_refused():
    state = cluster(gpu_node("sim01"))
    with pytest.raises(Rejected, match="Invalid partition name specified"):
        submit(state, partition="nosuch")


def test_a_time_limit_beyond_the_partition_maximum_is_refused():
    parts = (c.PartitionDef(name="short", default=True, max_time_min=60),)
    state = cluster(gpu_node("sim01"), partitions=parts)
    with pytest.raises(Rejected, match="time limit"):
        submit(state, time_limit_min=61)
    job_id = submit(state)
    assert state.jobs[job_id].time_limit_min == 60


def test_a_multi_node_job_gets_every_node_or_none():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    blocker = submit(state, gpus_per_node=4)
    schedule(state)
    wide = submit(state, nodes=2, gpus_per_node=8)
    schedule(state)
    assert state.jobs[wide].state is JobState.PENDING
    assert state.nodes["sim02"].free_gpus() == list(range(8))
    state.apply(c.JobFinished(cmd_id(), 1010.0, blocker, 1, "sim01", 0, 0))
    schedule(state, now=1011.0)
    assert state.jobs[wide].nodes == ("sim01", "sim02")


def test_a_lost_node_fails_its_jobs_or_requeues_them():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    plain = submit(state, gpus_per_node=8)
    again = submit(state, gpus_per_node=8, requeue=True)
    schedule(state)
    assert {state.jobs[plain].nodes[0], state.jobs[again].nodes[0]} == {"sim01", "sim02"}
    state.apply(c.NodeLost(cmd_id(), 1010.0, state.jobs[plain].nodes[0]))
    state.apply(c.NodeLost(cmd_id(), 1010.0, state.jobs[again].nodes[0]))
    state.validate()
    assert state.jobs[plain].state is JobState.NODE_FAIL
    assert state.jobs[again].state is JobState.PENDING
    assert state.nodes["sim01"].state_word == "down"
    state.apply(c.RegisterNode(cmd_id(), 1020.0, gpu_node("sim01")))
    schedule(state, now=1021.0)
    assert state.jobs[again].state is JobState.RUNNING
    assert state.jobs[again].attempt == 2


def test_each_loss_of_a_node_starts_a_new_epoch_that_its_launches_carry():
    state = cluster(gpu_node("sim01"))
    first = submit(state, gpus_per_node=8, requeue=True)
    (launch,) = [e for e in schedule(state) if isinstance(e, Launch)]
    assert (launch.job_id, launch.attempt, launch.epoch) == (first, 1, 0)
    state.apply(c.NodeLost(cmd_id(), 1010.0, "sim01"))
    assert state.nodes["sim01"].epoch == 1
    state.apply(c.NodeLost(cmd_id(), 1011.0, "sim01"))  # already down: no new epoch
    assert state.nodes["sim01"].epoch == 1
    state.apply(c.RegisterNode(cmd_id(), 1020.0, gpu_node("sim01")))
    (again,) = [e for e in schedule(state, now=1021.0) if isinstance(e, Launch)]
    # The requeued job's new launch is of the new epoch: the agent, told it by the
    # heartbeat, refuses the first one if it arrives late (agents/launcher.py).
    assert (again.job_id, again.attempt, again.epoch) == (first, 2, 1)


def test_a_time_limit_ends_the_job_as_timeout():
    state = cluster(gpu_node("sim01"))
    job_id = submit(state, time_limit_min=1)
    schedule(state)
    effects = state.apply(c.TimeLimitReached(cmd_id(), 1070.0, job_id, 1))
    assert any(isinstance(e, Signal) and e.escalate for e in effects)
    state.apply(c.JobFinished(cmd_id(), 1071.0, job_id, 1, "sim01", 0, 15))
    assert state.jobs[job_id].state is JobState.TIMEOUT


def test_a_new_leader_redoes_unacknowledged_launches():
    state = cluster(gpu_node("sim01"))
    launched = submit(state)
    started = submit(state)
    schedule(state)
    state.apply(c.JobStarted(cmd_id(), 1003.0, started, 1, "sim01", 77))
    redo = state.redo_effects()
    assert [e.job_id for e in redo if isinstance(e, Launch)] == [launched]
    assert sorted(e.job_id for e in redo if isinstance(e, Emit)) == [launched, started]


def test_events_carry_an_increasing_sequence_number():
    state = cluster(gpu_node("sim01"))
    submit(state)
    effects = schedule(state)
    seqs = [e.seq for e in effects if isinstance(e, Emit)]
    assert seqs and seqs == sorted(seqs) and seqs[0] > 1


def test_replicas_applying_the_same_commands_reach_identical_bytes():
    commands = [
        c.ConfigurePartitions("p", 1.0, (c.PartitionDef(name="gpu", default=True),)),
        c.RegisterNode("n1", 1.0, gpu_node("sim01")),
        c.RegisterNode("n2", 1.0, gpu_node("sim02", model="h100")),
    ]
    one, two = ClusterState(), ClusterState()
    for cmd in commands:
        one.apply(cmd)
        two.apply(cmd)
    from tests.scheduler.core.factories import spec

    for i in range(5):
        cmd = c.SubmitJob(f"s{i}", 2.0 + i, spec(gpus_per_node=3))
        one.apply(cmd)
        two.apply(cmd)
    allocate = plan(one, now=10.0, cmd_id="a1")
    assert allocate is not None
    one.apply(allocate)
    two.apply(allocate)
    assert one.to_bytes() == two.to_bytes()


def test_jobs_that_ended_long_ago_are_purged_and_active_ones_kept():
    state = cluster(gpu_node("sim01"))
    old = submit(state)
    state.apply(c.CancelJob(cmd_id(), 1002.0, old))
    live = submit(state, now=1003.0)
    state.apply(c.PurgeJobs(cmd_id(), 2000.0, ended_before=1500.0))
    assert list(state.jobs) == [live]
    assert list(state.submissions.values()) == [live]
    state.validate()


def test_the_state_survives_a_pickle_round_trip_for_raft_snapshots():
    import pickle

    state = cluster(gpu_node("sim01"))
    submit(state, gpus_per_node=2)
    schedule(state)
    copy = pickle.loads(pickle.dumps(state))
    assert copy.to_bytes() == state.to_bytes()
    submit(copy)
    copy.validate()


def test_without_effect_views_events_carry_no_job_dict_and_the_state_is_the_same():
    """A follower's applies skip the job dict each event carries (only the leader sends
    events): the effects are the same events, and the state the same bytes."""
    states = [cluster(gpu_node("sim01")), cluster(gpu_node("sim01"))]
    states[1].effect_views = False
    effects = []
    for state in states:
        command = c.SubmitJob("same-key", 1001.0, submit_spec())
        effects.append(state.apply(command) + schedule(state))
    leader, follower = effects
    assert [type(e) for e in leader] == [type(e) for e in follower]
    events = [(e, f) for e, f in zip(leader, follower, strict=True) if isinstance(e, Emit)]
    assert [e.kind for e, _ in events] == ["submitted", "allocated"]
    assert all(e.job["job_id"] == 1 and f.job == {} for e, f in events)
    assert [(e.job_id, e.seq, e.at) for e, _ in events] == [
        (f.job_id, f.seq, f.at) for _, f in events
    ]
    assert states[0].to_bytes() == states[1].to_bytes()
    assert "effect_views" not in states[1].__getstate__()
