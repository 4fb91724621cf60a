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
from scheduler.core.contract.runs import decode_column
from scheduler.core.planner import plan_pass
from scheduler.ctld.reads import ColumnsMemo, JobReads
from scheduler.ctld.replica import Replica
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, spec, submit
from tests.scheduler.core.test_properties import Driver, job_op, other_op, submit_op

FIELDS = ["job_id", "state", "reason", "priority", "user", "nodes", "start_time", "array_task_id"]
FIELDS += ["expected_start", "sched_nodes"]


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
    st.one_of(
        submit_op,
        job_op,
        other_op,
        st.tuples(st.just("read"), queries),
        st.tuples(st.just("pass"), st.booleans()),  # with start estimates or without
    ),
    min_size=1,
    max_size=50,
)


def fresh(reads: JobReads, query: dict[str, Any]) -> dict[str, Any]:
    """The answer a reads with an empty memo builds (the same pass's priorities and
    estimates)."""
    other = JobReads()
    other.attach(reads.replica)
    other.priorities = reads.priorities
    other.reservations = reads.reservations
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
            # Read again: from the memo this time, the same answer; and in runs
            # (`shape=runs`), the runs kept with the memo's entry, read back the same.
            assert reads.job_columns(tenant="acme", **query) == fresh(reads, query)
            assert read_back(reads.job_columns(tenant="acme", runs=True, **query)) == fresh(
                reads, query
            )
        elif op[0] == "pass":
            driver.now += 3.0
            reads.keep(plan_pass(driver.state, now=driver.now, cmd_id="p", estimate=op[1]))
        else:
            driver.step(op)
        # squeue's own question after every step: kept from the step before, if the memo
        # wrongly kept it.
        assert reads.job_columns(tenant="acme", **SQUEUE) == fresh(reads, SQUEUE)
        squeue_runs = reads.job_columns(tenant="acme", runs=True, **SQUEUE)
        assert read_back(squeue_runs) == fresh(reads, SQUEUE)


def read_back(answer: dict[str, Any]) -> dict[str, Any]:
    """A `runs=True` answer's columns as plain lists (`contract.runs`)."""
    n = answer["n"]
    return {"n": n, "columns": {f: decode_column(c, n) for f, c in answer["columns"].items()}}


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


# -- start estimates (squeue --start) --------------------------------------------------------

T0 = 10_000.0


class Still:
    """A replica that holds one state: its lock, and a version no command moves."""

    def __init__(self, state: Any) -> None:
        self.lock = threading.RLock()
        self.state = state
        self.version = 0


def busy_cluster() -> tuple[Any, JobReads, int, int, int]:
    """One node busy for an hour; one job waiting for it, one held."""
    state = cluster(gpu_node("sim01"))
    busy = submit(state, now=T0, gpus_per_node=8, time_limit_min=60)
    state.apply(plan_pass(state, now=T0, cmd_id="start").allocate)
    waiting = submit(state, now=T0 + 1, gpus_per_node=8, time_limit_min=30)
    held = submit(state, now=T0 + 2, gpus_per_node=8, hold=True)
    reads = JobReads()
    reads.attach(Still(state))  # type: ignore[arg-type]
    return state, reads, busy, waiting, held


def test_a_waiting_job_shows_when_and_where_the_last_estimate_expects_it() -> None:
    state, reads, busy, waiting, held = busy_cluster()
    asked = ["job_id", "expected_start", "sched_nodes"]
    assert reads.job_columns(fields=asked)["columns"]["expected_start"] == [None] * 3
    reads.keep(plan_pass(state, now=T0 + 10, cmd_id="p", estimate=True))
    # The state did not move (the memo's answer), but the estimate did.
    assert reads.job_columns(fields=asked)["columns"] == {
        "job_id": [busy, waiting, held],
        "expected_start": [None, int(T0 + 3600), None],
        "sched_nodes": [[], ["sim01"], []],
    }
    job = reads.job(waiting)
    assert job is not None and (job["expected_start"], job["sched_nodes"]) == (T0 + 3600, ["sim01"])
    assert reads.jobs(fields=["job_id", "expected_start"]) == [
        {"job_id": busy, "expected_start": None},  # it started: nothing to expect
        {"job_id": waiting, "expected_start": T0 + 3600},
        {"job_id": held, "expected_start": None},  # held: whatever the resources
    ]


def test_estimates_are_due_every_few_seconds_and_kept_in_between() -> None:
    state, reads, _, waiting, _ = busy_cluster()
    reads = JobReads(estimate_every_s=3600.0)
    reads.attach(Still(state))  # type: ignore[arg-type]
    assert reads.estimate_due() and not reads.estimate_due()
    reads.keep(plan_pass(state, now=T0 + 10, cmd_id="p", estimate=True))
    reads.keep(plan_pass(state, now=T0 + 11, cmd_id="q"))  # made none: the last ones stay
    assert reads.reservations[waiting].start == T0 + 3600
    reads.forget()  # no longer the leader
    job = reads.job(waiting)
    assert job is not None and (job["expected_start"], job["sched_nodes"]) == (None, [])
    assert reads.estimate_due()  # at once, should it lead again


def test_a_job_waiting_for_its_begin_time_is_expected_then() -> None:
    state, reads, _, _, _ = busy_cluster()
    later = submit(state, now=T0 + 3, gpus_per_node=1, begin_time=T0 + 7200)
    reads.keep(plan_pass(state, now=T0 + 10, cmd_id="p", estimate=True))
    job = reads.job(later)
    assert job is not None
    assert (job["reason"], job["expected_start"], job["sched_nodes"]) == (
        "BeginTime",
        T0 + 7200,
        [],
    )
    columns = reads.job_columns(fields=["job_id", "expected_start"])["columns"]
    assert columns["expected_start"][columns["job_id"].index(later)] == int(T0 + 7200)
