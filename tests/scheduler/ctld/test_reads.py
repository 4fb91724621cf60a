"""The controller's job reads keep the last columns answers of the state as it is
(`reads.ColumnsMemo`): an answer is never one of an older state, nor of other filters or
fields, nor of another pass's priorities. On random sequences of commands (the state
machine properties' driver), every memoized answer equals one built afresh; on a real
replica, each committed entry moves the version the memo is keyed by."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import commands as c
from scheduler.core.planner import plan_pass
from scheduler.ctld.reads import ColumnsMemo, JobReads
from scheduler.ctld.replica import Replica
from tests.scheduler.core.factories import cmd_id, gpu_node, spec
from tests.scheduler.core.test_properties import Driver, job_op, other_op, submit_op

FIELDS = ["job_id", "state", "reason", "priority", "user", "nodes", "start_time", "array_task_id"]


class Versioned:
    """What the reads need of a replica: the state, its lock and its version, the
    version moved by every command as the replica's apply moves it."""

    def __init__(self, driver: Driver) -> None:
        self.lock = threading.RLock()
        self.driver = driver
        self.version = 0

    @property
    def state(self) -> Any:
        return self.driver.state


class VersionedDriver(Driver):
    def __init__(self) -> None:
        self.replica = Versioned(self)
        super().__init__()

    def do(self, cmd: c.Command | None) -> None:
        self.replica.version += 1
        super().do(cmd)


SQUEUE: dict[str, Any] = {"states": {"PENDING", "RUNNING", "SUSPENDED"}, "fields": FIELDS}
queries = st.fixed_dictionaries(
    {
        "states": st.sampled_from(
            [None, {"PENDING"}, {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING"}, {"CANCELLED"}]
        ),
        "users": st.sampled_from([(), ("alice",), ("bob",)]),
        "ended_after": st.sampled_from([None, 0.0, 1100.0]),
        "fields": st.sampled_from([FIELDS, FIELDS[:3], ["job_id", "priority"]]),
    }
)
ops = st.lists(
    st.one_of(submit_op, job_op, other_op, st.tuples(st.just("read"), queries), st.just(("pass",))),
    min_size=1,
    max_size=50,
)


def fresh(reads: JobReads, query: dict[str, Any]) -> dict[str, Any]:
    """The answer a reads with an empty memo builds (the same pass's priorities)."""
    other = JobReads()
    other.attach(reads.replica)
    other.priorities = reads.priorities
    return other.job_columns(tenant="acme", **query)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_a_memoized_answer_is_always_the_one_built_afresh(steps: list[Any]) -> None:
    driver = VersionedDriver()
    reads = JobReads()
    reads.attach(driver.replica)  # type: ignore[arg-type]
    for op in steps:
        if op[0] == "read":
            query = op[1]
            assert reads.job_columns(tenant="acme", **query) == fresh(reads, query)
            # Read again: from the memo this time, the same answer.
            assert reads.job_columns(tenant="acme", **query) == fresh(reads, query)
        elif op[0] == "pass":
            driver.now += 3.0
            reads.priorities = plan_pass(driver.state, now=driver.now, cmd_id="p").factors
        else:
            driver.step(op)
        # squeue's own question after every step: kept from the step before, if the memo
        # wrongly kept it.
        assert reads.job_columns(tenant="acme", **SQUEUE) == fresh(reads, SQUEUE)


def test_the_memo_forgets_every_answer_when_the_version_moves() -> None:
    memo = ColumnsMemo(size=2)
    built: Any = object()
    memo.put(1, ("a",), built)
    assert memo.get(1, ("a",)) is built
    assert memo.get(2, ("a",)) is None
    memo.put(2, ("a",), built)
    assert memo.get(1, ("a",)) is None  # an older version's key finds nothing either
    memo.put(3, ("a",), built)
    memo.put(3, ("b",), built)
    memo.get(3, ("a",))  # used: "b" is now the oldest
    memo.put(3, ("c",), built)
    assert memo.get(3, ("b",)) is None and memo.get(3, ("a",)) is built


class Ranked:
    def __init__(self, priority: int) -> None:
        self.priority = priority


def test_the_priority_column_is_the_last_passs_even_when_nothing_else_changed() -> None:
    driver = VersionedDriver()
    driver.do(c.SubmitJob(driver.cid(), driver.now, spec()))
    reads = JobReads()
    reads.attach(driver.replica)  # type: ignore[arg-type]
    reads.priorities = {1: Ranked(5)}  # type: ignore[dict-item]
    query: dict[str, Any] = {"tenant": "acme", "fields": ["job_id", "priority"]}
    assert reads.job_columns(**query)["columns"]["priority"] == [5]
    reads.priorities = {1: Ranked(9)}  # type: ignore[dict-item]  # the next pass
    assert reads.job_columns(**query)["columns"]["priority"] == [9]


def test_a_dependency_column_is_described_as_of_each_read_not_kept() -> None:
    driver = VersionedDriver()
    driver.do(c.SubmitJob(driver.cid(), driver.now, spec(name="first")))
    driver.do(c.SubmitJob(driver.cid(), driver.now, spec(dependency="afterok:1")))
    reads = JobReads()
    reads.attach(driver.replica)  # type: ignore[arg-type]
    answer = reads.job_columns(tenant="acme", fields=["job_id", "dependency"])
    assert answer["columns"]["dependency"] == ["(null)", "afterok:1(unfulfilled)"]
    assert reads._memo.get(driver.replica.version, ()) is None  # nothing was kept


def test_each_entry_a_real_replica_applies_moves_its_version(tmp_path: Path) -> None:
    replica = Replica(
        address="127.0.0.1:0",
        peers=[],
        state_dir=str(tmp_path),
        on_effects=lambda command, effects: None,
        on_leader_change=lambda leading: None,
    )
    reads = JobReads()
    reads.attach(replica)
    try:
        deadline = time.monotonic() + 10
        while not (replica.is_ready and replica.is_leader) and time.monotonic() < deadline:
            time.sleep(0.05)
        replica.commit(
            c.ConfigurePartitions(cmd_id(), 1000.0, (c.PartitionDef("gpu", default=True),))
        )
        replica.commit(c.RegisterNode(cmd_id(), 1000.0, gpu_node("n1")))
        job_id = replica.commit(c.SubmitJob(cmd_id(), 1000.0, spec(hold=True)))
        query: dict[str, Any] = {"tenant": "acme", "fields": ["job_id", "state", "reason"]}
        before = replica.version
        first = reads.job_columns(**query)
        assert reads.job_columns(**query) == first and replica.version == before
        assert first["columns"]["reason"] == ["JobHeldUser"]
        replica.commit(c.CancelJob(cmd_id(), 1001.0, job_id))
        assert replica.version > before
        assert reads.job_columns(**query)["columns"]["state"] == ["CANCELLED"]
    finally:
        replica.destroy()
