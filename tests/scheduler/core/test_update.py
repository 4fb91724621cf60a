"""UpdateJob (scontrol update): an owner changes a pending job's name, time limit, nice,
partition or comment, checked as a submission would be; nothing else, and nothing of a
job that runs. The edge parses the changes from the contract's UPDATE_FIELDS."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import SPEC_FIELDS
from scheduler.core.contract.update import UPDATE_FIELDS, parse_update
from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.core.priority import ranker
from scheduler.core.shares import policy_report
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit

T0 = 1000.0
PARTS = (
    c.PartitionDef(name="gpu", default=True, max_time_min=600),
    c.PartitionDef(name="short", nodes="n2", max_time_min=30),
)


def state_with_a_job(**spec: Any) -> tuple[ClusterState, int]:
    state = cluster(gpu_node("n1"), gpu_node("n2", gpus=2), partitions=PARTS, now=T0)
    return state, submit(state, now=T0 + 1, **spec)


def update(state: ClusterState, job_id: int, admin: bool = False, **changes: Any) -> None:
    state.apply(c.UpdateJob(cmd_id(), T0 + 2, job_id, parse_update(changes), admin=admin))
    state.validate()


def test_the_updatable_fields_are_spec_fields_with_the_specs_bounds() -> None:
    assert {f.name for f in UPDATE_FIELDS} == {"name", "time_limit_min", "nice", "partition",
                                               "comment"}  # fmt: skip
    assert all(f in SPEC_FIELDS for f in UPDATE_FIELDS)


def test_a_pending_jobs_name_limit_nice_partition_and_comment_change() -> None:
    state, job_id = state_with_a_job(gpus_per_node=8, hold=True)
    update(state, job_id, name="renamed", time_limit_min=90, nice=100, comment="later")
    job = state.jobs[job_id]
    assert (job.spec.name, job.time_limit_min, job.spec.nice, job.spec.comment) == (
        "renamed", 90, 100, "later")  # fmt: skip
    rank = ranker(state, T0 + 3)
    assert rank.factors(job).nice == 100
    before = state.to_bytes()
    with pytest.raises(Rejected):
        update(state, job_id, partition="short", time_limit_min=20)  # 8 GPUs; n2 has 2
    assert state.to_bytes() == before


def test_a_partition_change_that_fits_moves_the_job_and_keeps_its_limit_within_it() -> None:
    state, job_id = state_with_a_job(gpus_per_node=1, hold=True)
    with pytest.raises(Rejected, match="time limit is invalid"):
        update(state, job_id, partition="short", time_limit_min=60)
    update(state, job_id, partition="short", time_limit_min=30)
    job = state.jobs[job_id]
    assert (job.partition, job.shape.partition, job.time_limit_min) == ("short", "short", 30)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"partition": "nowhere"}, "Invalid partition name specified"),
        ({"time_limit_min": 601}, "Requested time limit is invalid"),
        ({"nice": -5}, "Access/permission denied"),
    ],
)
def test_it_refuses_an_update_that_submit_would_refuse(
    changes: dict[str, Any], message: str
) -> None:
    state, job_id = state_with_a_job(hold=True)
    before = state.to_bytes()
    with pytest.raises(Rejected, match=message):
        update(state, job_id, **changes)
    assert state.to_bytes() == before


def test_an_operator_may_set_a_negative_nice() -> None:
    state, job_id = state_with_a_job(hold=True)
    update(state, job_id, admin=True, nice=-10)
    assert state.jobs[job_id].spec.nice == -10


def test_a_running_job_is_not_updated() -> None:
    state, job_id = state_with_a_job()
    from tests.scheduler.core.test_lifecycle import start

    assert start(state, job_id)
    with pytest.raises(Rejected, match="no longer pending"):
        update(state, job_id, name="x")


@pytest.mark.parametrize(
    "body",
    [{}, {"gpus": 4}, {"nice": "5"}, {"name": "x" * 201}, {"time_limit_min": -1}, None],
)
def test_the_edge_refuses_what_may_not_change_or_is_out_of_bounds(body: Any) -> None:
    with pytest.raises(InvalidSpec):
        parse_update(body)


def test_an_update_emits_an_event_and_survives_a_snapshot() -> None:
    state, job_id = state_with_a_job(hold=True)
    effects = state.apply(c.UpdateJob(cmd_id(), T0 + 2, job_id, parse_update({"comment": "c"})))
    assert [getattr(e, "kind", "") for e in effects] == ["updated"]
    assert pickle.loads(pickle.dumps(state)).jobs[job_id].spec.comment == "c"


def test_the_policy_report_gives_each_account_its_shares_usage_and_factor() -> None:
    state, _ = state_with_a_job()
    report = policy_report(state, T0 + 5)
    (acme,) = report["accounts"]
    assert (acme["account"], acme["shares"], acme["fairshare"]) == ("acme", 1, 1.0)
    assert [q["name"] for q in report["qos"]] == ["normal", "spot", "interactive"]
    assert report["weights"]["fairshare"] == 10_000
