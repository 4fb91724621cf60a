"""Drain and resume (scontrol update NodeName=x State=DRAIN|RESUME): a drained node takes
no new job, keeps what runs there, and keeps its drain across losing and registering."""

from __future__ import annotations

import pickle

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.errors import Rejected
from scheduler.core.planner import plan
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit


def schedule(state: ClusterState, now: float = 1002.0) -> None:
    allocate = plan(state, now=now, cmd_id=cmd_id())
    if allocate:
        state.apply(allocate)
    state.validate()


def drain(state: ClusterState, node: str, reason: str = "bad fan") -> None:
    state.apply(c.DrainNode(cmd_id(), 1001.5, node, reason, by="ops"))


def test_a_drained_node_takes_no_new_job_until_it_is_resumed() -> None:
    state = cluster(gpu_node("sim01"))
    drain(state, "sim01")
    job = submit(state, gpus_per_node=1)
    schedule(state)
    assert state.jobs[job].state is JobState.PENDING
    node = state.nodes["sim01"].to_dict()
    assert (node["state"], node["reason"]) == ("drain", "bad fan")

    state.apply(c.ResumeNode(cmd_id(), 1003.0, "sim01"))
    schedule(state, now=1004.0)
    assert state.jobs[job].state is JobState.RUNNING
    assert state.nodes["sim01"].to_dict()["reason"] == ""


def test_a_job_that_asks_for_a_drained_node_waits_for_it() -> None:
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    drain(state, "sim01")
    job = submit(state, gpus_per_node=1, nodelist=("sim01",))
    schedule(state)
    assert state.jobs[job].state is JobState.PENDING
    assert state.jobs[job].reason == "ReqNodeNotAvail"


def test_draining_keeps_the_running_jobs_and_places_new_ones_elsewhere() -> None:
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    running = submit(state, gpus_per_node=8)
    schedule(state)
    busy = state.jobs[running].nodes[0]
    other = "sim02" if busy == "sim01" else "sim01"
    drain(state, busy)
    assert state.nodes[busy].state_word == "drain"  # with jobs: sinfo says draining
    later = submit(state, gpus_per_node=1)
    schedule(state, now=1005.0)
    assert state.jobs[running].state is JobState.RUNNING
    assert state.jobs[later].nodes == (other,)


def test_a_drain_outlives_losing_and_registering_the_node() -> None:
    state = cluster(gpu_node("sim01"))
    drain(state, "sim01")
    state.apply(c.NodeLost(cmd_id(), 1010.0, "sim01"))
    node = state.nodes["sim01"].to_dict()
    assert (node["state"], node["reason"]) == ("down", "Not responding")
    state.apply(c.RegisterNode(cmd_id(), 1020.0, gpu_node("sim01")))
    node = state.nodes["sim01"].to_dict()
    assert (node["state"], node["reason"]) == ("drain", "bad fan")
    back = pickle.loads(pickle.dumps(state))
    assert back.nodes["sim01"].drained and back.nodes["sim01"].drain_reason == "bad fan"


def test_drain_and_resume_are_idempotent() -> None:
    state = cluster(gpu_node("sim01"))
    state.apply(c.ResumeNode(cmd_id(), 1001.0, "sim01"))  # not drained: nothing happens
    drain(state, "sim01")
    drain(state, "sim01", reason="new fan on order")
    assert state.nodes["sim01"].drain_reason == "new fan on order"


@pytest.mark.parametrize("reason", ["", "   ", "x" * (c.MAX_NODE_REASON + 1), "two\nlines"])
def test_a_drain_needs_a_short_printable_reason(reason: str) -> None:
    state = cluster(gpu_node("sim01"))
    with pytest.raises(Rejected, match="a drain needs a reason"):
        drain(state, "sim01", reason=reason)
    assert not state.nodes["sim01"].drained


def test_an_unknown_node_is_not_found() -> None:
    state = cluster(gpu_node("sim01"))
    for command in (
        c.DrainNode(cmd_id(), 1001.0, "nope", "x"),
        c.ResumeNode(cmd_id(), 1001.0, "nope"),
    ):
        with pytest.raises(Rejected, match="Invalid node name specified: nope") as refused:
            state.apply(command)
        assert refused.value.code == "not_found"
