"""Property tests: random command sequences keep every invariant, never hold a GPU past
its capacity, refuse without changing anything, and replay byte for byte on a replica
(also through a pickle round trip, as a Raft snapshot). Commands name jobs among every
task the state lists, so a task of an array's pending remainder is started, held,
released, cancelled, updated and depended on by its own job id."""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import commands as c
from scheduler.core.contract import HOLDS_RESOURCES, JobState
from scheduler.core.errors import Rejected
from scheduler.core.freemap import FreeMap
from scheduler.core.planner import plan
from scheduler.core.state import ClusterState
from tests.scheduler.core.factories import gpu_node, spec

NODES = ("n1", "n2", "n3")
SHAPES = (
    {"gpus_per_node": 1},
    {"gpus_per_node": 4},
    {"gpus_per_node": 8},
    {"gpus_per_node": 2, "nodes": 2},
    {"gpu_milli": 250},
    {"gpu_milli": 500},
    {"shards": 2},
    {},
)

submit_op = st.tuples(
    st.just("submit"),
    st.sampled_from(range(len(SHAPES))),
    st.sampled_from(["", "0-3%2", "0,2", "0-5%1", "0-7", "2-9:3"]),
    st.sampled_from(
        ["", "afterok", "afternotok", "afterany", "after", "after+", "singleton", "or", "task"]
    ),
    st.integers(0, 50),  # which earlier job a dependency names
    st.sampled_from([False, False, False, True]),  # --hold
    st.sampled_from([None, None, None, 30.0]),  # begin this long after now
    st.sampled_from(["", "spot"]),
)
job_op = st.tuples(
    st.sampled_from(
        [
            "cancel",
            "started",
            "finished",
            "failed",
            "hold",
            "release",
            "requeue",
            "admin_hold",
            "suspend",
            "resume",
            "timeout",
        ]
    ),
    st.integers(0, 50),
)
other_op = st.one_of(
    st.tuples(st.just("plan")),
    st.tuples(
        st.sampled_from(["lost", "register", "drain_node", "resume_node"]), st.sampled_from(NODES)
    ),
    st.tuples(st.just("preempt"), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("purge")),
)
plan_op = st.tuples(st.just("plan"))
ops = st.lists(
    st.one_of(submit_op, submit_op, job_op, job_op, plan_op, plan_op, other_op),
    min_size=1,
    max_size=40,
)


class Driver:
    """Turns abstract operations into commands against the current state; keeps them so
    a replica can replay exactly the same log."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.log: list[c.Command] = []
        self.now = 1000.0
        self.n = 0
        self.do(c.ConfigurePartitions(self.cid(), self.now, (c.PartitionDef("gpu", default=True),)))
        for name in NODES:
            self.do(c.RegisterNode(self.cid(), self.now, gpu_node(name)))

    def cid(self) -> str:
        self.n += 1
        return f"c{self.n}"

    def do(self, cmd: c.Command | None) -> None:
        if cmd is None:
            return
        before = self.state.to_bytes()
        try:
            self.state.apply(cmd)
        except Rejected:
            assert self.state.to_bytes() == before, f"{type(cmd).__name__} refused half-way"
        self.log.append(cmd)
        self.state.validate()
        check_gpu_capacity(self.state)
        check_free_map(self.state)

    def pick(self, k: int, states: frozenset[JobState] | None = None) -> Any:
        """The k-th of the jobs (in `states`), among every task the state lists."""
        jobs = sorted(
            (j for j in self.state.listed() if states is None or j.state in states),
            key=lambda j: j.job_id,
        )
        return jobs[k % len(jobs)] if jobs else None

    def step(self, op: tuple[Any, ...]) -> None:
        self.now += 7.0
        kind, now = op[0], self.now
        if kind == "submit":
            _, shape, array, dep, target, hold, begin, qos = op
            fields: dict[str, Any] = dict(SHAPES[shape], array=array, hold=hold, qos=qos)
            fields["begin_time"] = None if begin is None else now + begin
            earlier = self.pick(target)
            if dep == "singleton":
                fields["dependency"] = "singleton"
            elif dep and earlier is not None:
                ref = earlier.job_id
                if dep == "task" and earlier.array_job_id is not None:
                    ref = f"{earlier.array_job_id}_{earlier.array_task_id}"
                fields["dependency"] = {
                    "or": f"afterok:{ref}?afternotok:{ref}",
                    "after+": f"after:{ref}+1",
                    "task": f"afterany:{ref}",
                }.get(dep, f"{dep}:{ref}")
            self.do(c.SubmitJob(self.cid(), now, spec(**fields)))
        elif kind in ("cancel", "hold", "release", "admin_hold", "requeue", "suspend", "resume"):
            job = self.pick(op[1])
            if job is not None:
                self.do(
                    {
                        "cancel": lambda j: c.CancelJob(self.cid(), now, j),
                        "hold": lambda j: c.HoldJob(self.cid(), now, j),
                        "admin_hold": lambda j: c.HoldJob(self.cid(), now, j, admin=True),
                        "release": lambda j: c.ReleaseJob(self.cid(), now, j, admin=True),
                        "requeue": lambda j: c.RequeueJob(self.cid(), now, j),
                        "suspend": lambda j: c.SuspendJob(self.cid(), now, j, admin=True),
                        "resume": lambda j: c.ResumeJob(self.cid(), now, j, admin=True),
                    }[kind](job.job_id)
                )
        elif kind in ("started", "finished", "failed"):
            job = self.pick(op[1], HOLDS_RESOURCES)
            if job is not None:
                if kind == "started":
                    cmd: c.Command = c.JobStarted(
                        self.cid(), now, job.job_id, job.attempt, job.nodes[0], 4242
                    )
                else:
                    code = 0 if kind == "finished" else 1
                    cmd = c.JobFinished(
                        self.cid(), now, job.job_id, job.attempt, job.nodes[0], code
                    )
                self.do(cmd)
        elif kind == "timeout":
            job = self.pick(op[1], frozenset({JobState.RUNNING}))
            if job is not None:
                self.do(c.TimeLimitReached(self.cid(), now, job.job_id, job.attempt))
        elif kind == "plan":
            self.do(plan(self.state, now=now, cmd_id=self.cid()))
        elif kind == "lost":
            self.do(c.NodeLost(self.cid(), now, op[1]))
        elif kind == "register":
            self.do(c.RegisterNode(self.cid(), now, gpu_node(op[1])))
        elif kind == "drain_node":
            self.do(c.DrainNode(self.cid(), now, op[1], reason="maintenance"))
        elif kind == "resume_node":
            self.do(c.ResumeNode(self.cid(), now, op[1]))
        elif kind == "preempt":
            victim = self.pick(op[1], frozenset({JobState.RUNNING}))
            target = self.pick(op[2], frozenset({JobState.PENDING}))
            if victim is not None and target is not None:
                self.do(c.Preempt(self.cid(), now, (victim.job_id,), target.job_id))
        elif kind == "purge":
            self.do(c.PurgeJobs(self.cid(), now, ended_before=now - 20))


def check_free_map(state: ClusterState) -> None:
    """The planner's kept free map is always what a fresh one from the nodes says."""
    kept, fresh = state.free_map(), FreeMap.of(state)

    def content(free: FreeMap) -> list[tuple[str, list[int], int, int]]:
        return [
            (v.name, [v.free_milli(d) for d in range(len(v.used))], v.cpus, v.mem_mb)
            for v in free.nodes
        ]

    assert content(kept) == content(fresh), "the kept free map went stale"


def check_gpu_capacity(state: ClusterState) -> None:
    held: dict[tuple[str, int], int] = {}
    for job in state.jobs.values():
        if job.state not in HOLDS_RESOURCES:
            continue
        for name, alloc in job.allocation.items():
            for i, g in enumerate(alloc.gpus):
                held[(name, g)] = held.get((name, g), 0) + alloc.milli(i)
    over = {k: v for k, v in held.items() if v > 1000}
    assert not over, f"GPUs held past their capacity: {over}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(0, 40))
def test_random_commands_keep_invariants_and_replay_byte_for_byte(
    operations: list[tuple[Any, ...]], snapshot_at: int
) -> None:
    driver = Driver()
    for op in operations:
        driver.step(op)

    replica = ClusterState()
    replica.effect_views = False  # a follower's: its events carry no job dicts
    cut = min(snapshot_at, len(driver.log))
    for cmd in driver.log[:cut]:
        with contextlib.suppress(Rejected):
            replica.apply(cmd)
    replica = pickle.loads(pickle.dumps(replica))  # a Raft snapshot, then the rest of the log
    assert replica.effect_views  # local, not in the snapshot
    replica.effect_views = False
    for cmd in driver.log[cut:]:
        with contextlib.suppress(Rejected):
            replica.apply(cmd)
    replica.validate()
    assert replica.to_bytes() == driver.state.to_bytes()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.lists(st.integers(1, 8), min_size=1, max_size=60))
def test_the_log_replayed_in_batches_ends_byte_for_byte_the_same(
    operations: list[tuple[Any, ...]], sizes: list[int]
) -> None:
    """Group commit: a replica that applies the same commands grouped into log entries
    (`commands.Batch`, `ClusterState.apply_each`) ends in the same state, and each
    command's outcome is the one it had alone."""
    driver = Driver()
    for op in operations:
        driver.step(op)
    alone = ClusterState()
    expected = []
    for cmd in driver.log:
        try:
            alone.apply(cmd)
            expected.append(True)
        except Rejected:
            expected.append(False)
    batched = ClusterState()
    outcomes: list[bool] = []
    log, i = driver.log, 0
    while i < len(log):
        size = sizes[len(outcomes) % len(sizes)]
        chunk = c.Batch(f"b{i}", 0.0, tuple(log[i : i + size]))
        outcomes += [not isinstance(r, Rejected) for r in batched.apply_each(chunk.commands)]
        i += size
    assert outcomes == expected
    assert batched.to_bytes() == driver.state.to_bytes() == alone.to_bytes()
