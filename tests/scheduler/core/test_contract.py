"""The job contract (scheduler/core/contract) and the core layers built from it agree:
states and Slurm's tables, actions and the command table, spec fields and their bounds,
the resource request, the job object's keys, the transition table."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import (
    ACTIVE,
    GPU_FRACTION,
    HOLDS_RESOURCES,
    JOB_FIELDS,
    SPEC_FIELDS,
    TERMINAL,
    JobAction,
    JobSpec,
    JobState,
    Kind,
    ResourceRequest,
    StateKind,
)
from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.core.jobs import Job
from scheduler.core.planner import plan
from scheduler.core.state import ClusterState
from scheduler.core.transitions import STOPPED_INTO
from scheduler.slurm import states as slurm
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, spec, submit

# -- states ------------------------------------------------------------------------------


def test_every_state_has_its_own_slurm_code_and_one_kind() -> None:
    codes = [s.code for s in JobState]
    assert len(set(codes)) == len(codes)
    assert set(JobState) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert {s for s in JobState if s.kind is StateKind.RUNNING} == HOLDS_RESOURCES
    assert JobState("PREEMPTED") is JobState.PREEMPTED and JobState.PREEMPTED.code == "PR"


def test_slurms_tables_carry_every_state_with_the_contracts_code_and_group() -> None:
    for state in JobState:
        assert slurm.COMPACT[state.value] == state.code
        assert slurm.compact(state.value) == state.code
        assert (state.value in slurm.ACTIVE) == state.is_active
        assert (state.value in slurm.TERMINAL) == state.is_terminal
        assert slurm.parse_states(state.code) == {state.value}
    # Slurm's order, which squeue sorts by, is the contract's declaration order.
    ours = [s.value for s in JobState]
    assert sorted(ours, key=slurm.ORDER.__getitem__) == ours
    # Slurm's other states parse (a filter may name them) but are none of ours.
    assert not set(slurm.SLURM_ONLY) & set(ours)
    assert slurm.parse_states("ST,BF") == {"STOPPED", "BOOT_FAIL"}
    # Slurm takes the American spelling of one of ours, in either case.
    assert slurm.parse_states("canceled,CA") == {JobState.CANCELLED.value}
    with pytest.raises(ValueError, match="Invalid job state specified: CANCELLD"):
        slurm.parse_states("CANCELLD")


@pytest.mark.parametrize(
    ("state", "code", "signal", "job_row", "step_row"),
    [
        ("COMPLETED", 0, 0, "0:0", "0:0"),
        ("FAILED", 3, 0, "3:0", "3:0"),
        ("FAILED", 0, 15, "0:15", "0:15"),
        ("CANCELLED", 0, 0, "0:0", "0:15"),
        ("TIMEOUT", 0, 9, "0:0", "0:9"),
        ("PREEMPTED", 0, 15, "0:15", "0:15"),
    ],
)
def test_the_exit_code_reads_as_sacct_prints_it(
    state: str, code: int, signal: int, job_row: str, step_row: str
) -> None:
    assert slurm.exit_code_text(state, code, signal, step=False) == job_row
    assert slurm.exit_code_text(state, code, signal, step=True) == step_row


def test_the_transition_table_has_exactly_the_edges_a_job_may_take() -> None:
    P, R, CG = JobState.PENDING, JobState.RUNNING, JobState.COMPLETING
    expected = {(P, R), (P, JobState.CANCELLED), (R, CG), (R, P), (CG, P)}
    expected |= {
        (R, s)
        for s in (JobState.COMPLETED, JobState.FAILED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY)
    }
    expected |= {(CG, s) for s in STOPPED_INTO}
    # scontrol suspend/resume; a suspended job is stopped (cancel, requeue), lost with its
    # node (requeued or failed), or ends on its own.
    S = JobState.SUSPENDED
    expected |= {(R, S), (S, R), (S, CG), (S, P)}
    expected |= {
        (S, s)
        for s in (JobState.COMPLETED, JobState.FAILED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY)
    }
    assert set(ClusterState().transition_table()) == expected
    # Every state is reachable, and nothing leaves a terminal one.
    assert {to for _, to in expected} | {P} == set(JobState)
    assert not [edge for edge in expected if edge[0].is_terminal]


def test_an_edge_missing_from_the_table_is_a_bug_not_a_silent_change() -> None:
    state = cluster(gpu_node("n1"))
    job = state.jobs[submit(state)]
    with pytest.raises(AssertionError, match="illegal transition PENDING -> COMPLETED"):
        state.transition(job, JobState.COMPLETED, 1.0)
    assert job.state is JobState.PENDING


# -- actions -------------------------------------------------------------------------------


def test_every_action_has_a_command() -> None:
    assert set(c.ACTION_COMMANDS) == set(JobAction)
    made = {
        action: c.action_command("id", 1.0, c.ActionRequest(action, 7, admin=True, by="ann"))
        for action in JobAction
    }
    assert made[JobAction.CANCEL] == c.CancelJob("id", 1.0, 7, by="ann")
    assert made[JobAction.HOLD] == c.HoldJob("id", 1.0, 7, admin=True)
    assert made[JobAction.RELEASE] == c.ReleaseJob("id", 1.0, 7, admin=True)
    assert made[JobAction.REQUEUE] == c.RequeueJob("id", 1.0, 7)
    assert made[JobAction.REQUEUEHOLD] == c.RequeueJob("id", 1.0, 7, hold=True)
    assert made[JobAction.SUSPEND] == c.SuspendJob("id", 1.0, 7, admin=True)
    assert made[JobAction.RESUME] == c.ResumeJob("id", 1.0, 7, admin=True)
    signal = c.ActionRequest(JobAction.CANCEL, 7, signal=10)
    assert c.action_command("id", 1.0, signal) == c.SignalJob("id", 1.0, 7, 10)


def test_only_cancel_takes_a_signal() -> None:
    assert [a for a in JobAction if a.takes_signal] == [JobAction.CANCEL]
    with pytest.raises(InvalidSpec, match="hold takes no signal"):
        c.action_command("id", 1.0, c.ActionRequest(JobAction.HOLD, 7, signal=10))


# -- spec fields -----------------------------------------------------------------------------


def test_every_spec_field_is_declared_with_a_kind_help_and_bounds() -> None:
    assert [f.name for f in SPEC_FIELDS] == [f.name for f in dataclasses.fields(JobSpec)]
    for f in SPEC_FIELDS:
        assert f.help, f.name
        if f.kind in (Kind.STRING, Kind.STRINGS, Kind.STRING_MAP):
            assert f.bounds.max_length, f"{f.name} is an unbounded text"
        if f.kind in (Kind.STRINGS, Kind.STRING_MAP):
            assert f.bounds.item_max_length, f"{f.name} has unbounded items"
        if f.kind in (Kind.INTEGER, Kind.NUMBER):
            assert f.bounds.minimum is not None and f.bounds.maximum is not None, f.name
    assert {f.name for f in SPEC_FIELDS if f.bounds.stamped} == {"tenant", "user", "ssh_keys"}


def _wire(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize(
    "field", [f for f in SPEC_FIELDS if f.kind in (Kind.INTEGER, Kind.NUMBER)], ids=str
)
def test_a_number_just_outside_its_bounds_is_refused_by_name(field: Any) -> None:
    base: dict[str, Any] = {"script": "#!/bin/sh\n"}
    for value in (field.bounds.minimum - 1, field.bounds.maximum + 1, 2**64):
        with pytest.raises(InvalidSpec) as refused:
            JobSpec.from_dict({**base, field.name: value})
        assert refused.value.field == field.name


@pytest.mark.parametrize("field", [f for f in SPEC_FIELDS if f.kind is Kind.STRING], ids=str)
def test_a_text_too_long_or_with_nul_or_a_lone_surrogate_is_refused(field: Any) -> None:
    base: dict[str, Any] = {"script": "#!/bin/sh\n"}
    for value in ("x" * (field.bounds.max_length + 1), "a\x00b", "a\ud800b"):
        with pytest.raises(InvalidSpec) as refused:
            JobSpec.from_dict({**base, field.name: value})
        assert refused.value.field == field.name


def test_a_spec_survives_its_wire_form() -> None:
    full = spec(
        argv=("a", "b"),
        environment=(("A", "1"),),
        nodelist=("n1",),
        requeue=False,
        begin_time=5.0,
        array="0-3%2",
        gpu_milli=250,
    )
    assert JobSpec.from_dict(full.to_dict()) == full
    assert set(full.to_dict()) == {f.name for f in SPEC_FIELDS}


def test_the_api_fraction_is_a_bounded_alias_of_gpu_milli() -> None:
    assert JobSpec.from_dict({"script": "x", "gpu_fraction": 0.25}).gpu_milli == 250
    for bad in (0, 1, 0.0001, True, "0.5"):
        with pytest.raises(InvalidSpec):
            JobSpec.from_dict({"script": "x", GPU_FRACTION.name: bad})


# -- the resource request ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "per_node", "gpus", "milli"),
    [
        ({"gpus": 3, "nodes": 2}, 2, 4, 4000),  # spread evenly, rounding up
        ({"gpus_per_node": 2, "nodes": 3}, 2, 6, 6000),
        ({"gpu_milli": 250, "nodes": 2}, 0, 2, 500),  # a share touches one device per node
        ({"shards": 4}, 0, 1, 500),  # half of a GPU of 8 shards
        ({"shards": 12}, 2, 2, 2000),  # more than one GPU's shards: whole GPUs
        ({}, 0, 0, 0),
    ],
)
def test_the_request_says_the_same_gpus_everywhere(
    fields: dict[str, int], per_node: int, gpus: int, milli: int
) -> None:
    request = ResourceRequest.of(spec(**fields))
    assert (request.gpus_per_node, request.gpus, request.gpu_milli) == (per_node, gpus, milli)
    state = cluster(gpu_node("n1"), gpu_node("n2"), gpu_node("n3"))
    job = state.jobs[submit(state, **fields)]
    assert job.shape.resources == request
    assert job.to_dict()["num_gpus"] == gpus and job.to_dict()["gpu_milli"] == milli


def test_cpus_follow_tasks_spread_over_nodes() -> None:
    request = ResourceRequest.of(spec(nodes=2, ntasks=5, cpus_per_task=2))
    assert (request.cpus_per_node, request.cpus) == (6, 12)


# -- the job object ----------------------------------------------------------------------------


def test_a_job_dict_has_exactly_the_contracts_fields() -> None:
    state = cluster(gpu_node("n1"))
    job = state.jobs[submit(state)]
    always = {f.name for f in JOB_FIELDS if f.always}
    assert set(job.to_dict()) == always
    assert set(job.to_dict(with_spec=True)) == always | {"spec"}
    assert set(state.job_dict(job, 1.0)) == always


def test_job_objects_keys_are_unique_and_documented() -> None:
    names = [f.name for f in JOB_FIELDS]
    assert len(names) == len(set(names))
    assert all(f.help for f in JOB_FIELDS)


def test_effects_carry_the_command_that_caused_them() -> None:
    state = cluster(gpu_node("n1"))
    effects = state.apply(c.SubmitJob("submit-1", 1000.0, spec()))
    assert [e.cmd_id for e in effects] == ["submit-1"]
    job = state.jobs[1]
    alloc = c.Allocate(
        "plan-1", 1001.0, placements=(c.Placement(1, (("n1", _alloc(state, job)),)),)
    )
    assert {e.cmd_id for e in state.apply(alloc)} == {"plan-1"}
    assert {e.cmd_id for e in state.redo_effects("reconcile-1")} == {"reconcile-1"}


def _alloc(state: ClusterState, job: Job) -> Any:
    from scheduler.core.placement import place

    placed = place(state, job, state.free_map())
    assert placed is not None
    return placed[0][1]


def test_cmd_ids_stay_out_of_snapshots() -> None:
    state = cluster(gpu_node("n1"))
    submit(state)
    assert "_cmd_id" not in state.__getstate__()
    ids = itertools.count()
    assert state.apply(c.SubmitJob(f"x{next(ids)}", 1.0, spec()))  # still applies after


def test_a_job_the_kernel_killed_for_memory_ends_out_of_memory() -> None:
    state = cluster(gpu_node("n1"))
    job_id = submit(state, gpus_per_node=1)
    state.apply(plan(state, now=1001.5, cmd_id=cmd_id()))
    state.apply(c.JobStarted(cmd_id(), 1002.0, job_id, 1, "n1", 42, limits="rlimit"))
    assert state.jobs[job_id].limits == "rlimit"
    state.apply(c.JobFinished(cmd_id(), 1003.0, job_id, 1, "n1", 0, 9, "OutOfMemory", oom=True))
    job = state.jobs[job_id]
    assert (job.state, job.signal, job.reason) == (JobState.OUT_OF_MEMORY, 9, "OutOfMemory")
    assert job.to_dict()["limits"] == "rlimit"
    state.validate()


def test_a_no_requeue_job_is_never_requeued() -> None:
    state = cluster(gpu_node("n1", gpus=1))
    victim = submit(state, gpus_per_node=1, qos="spot", requeue=False)
    state.apply(plan(state, now=1001.5, cmd_id=cmd_id()))
    with pytest.raises(Rejected, match="--no-requeue"):
        state.apply(c.RequeueJob(cmd_id(), 1002.0, victim))
    urgent = submit(state, gpus_per_node=1)
    state.apply(c.Preempt(cmd_id(), 1003.0, (victim,), urgent))
    assert state.jobs[victim].end_state is JobState.PREEMPTED
    state.apply(c.JobFinished(cmd_id(), 1004.0, victim, 1, "n1", 0, 15))
    assert state.jobs[victim].state is JobState.PREEMPTED
    state.validate()


def test_jobs_alike_share_one_shape_even_after_a_snapshot() -> None:
    import pickle

    state = cluster(gpu_node("n1"))
    first, second = submit(state, gpus_per_node=2), submit(state, gpus_per_node=2)
    assert state.jobs[first].shape is state.jobs[second].shape
    back = pickle.loads(pickle.dumps(state))
    assert back.jobs[first].shape is back.jobs[second].shape
    assert back.jobs[first].shape == state.jobs[first].shape
    assert hash(back.jobs[first].shape) == hash(state.jobs[first].shape)
