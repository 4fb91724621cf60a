"""`ClusterState`: the replicated state machine of the controller.

`apply(command) -> list[Effect]` is the only way the state changes. It is deterministic:
replicas applying the same commands in the same order reach the same bytes
(`to_bytes()`). A command the state refuses raises `Rejected` before anything changes.

The handlers below decide what a command means; every change of a job's state goes
through the transition table (`transitions.py`); holds, requeues, preemption and pending
reasons live in `lifecycle.py`, which sees the state through a narrow view; a job's run
(its allocation, its agents' reports, its time limit) in `runs.py`; submissions, steps
and updates in `submit.py`, `steps.py` and `update.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import hostlist

from scheduler.core import arrays, invariants, lifecycle, runs, steps, submit, update
from scheduler.core import commands as c
from scheduler.core import dependencies as deps
from scheduler.core.backfill import Allocs, Future
from scheduler.core.contract import HOLDS_RESOURCES, JobShape, JobState
from scheduler.core.contract.request import interned
from scheduler.core.effects import Effect, Emit
from scheduler.core.errors import Rejected
from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import Job, NodeAlloc
from scheduler.core.nodes import Node
from scheduler.core.placement import unsatisfiable
from scheduler.core.policy import Policy, check_policy
from scheduler.core.ranking import PendingIndex
from scheduler.core.transitions import SIGCONT, SIGKILL, SIGSTOP, SIGTERM, JobTransitions

# Commands that never change what nodes hold or whether they are up: the free map
# survives them. Any other command drops it (a refused command changes nothing).
KEEPS_FREE_MAP = (
    c.SubmitJob,
    c.JobStarted,
    c.HoldJob,
    c.ReleaseJob,
    c.SignalJob,
    c.SuspendJob,  # a suspended job keeps what it holds
    c.ResumeJob,
    c.PurgeJobs,
    c.CreateStep,
    c.StepFinished,
    c.CancelStep,
    c.UpdateJob,
)
INTERNAL = "internal"  # the code of a command that raised something else than Rejected
# Derived, or only meaningful during one `apply`: never pickled into a Raft snapshot.
_NOT_STATE = (
    "effect_views",
    "_handlers",
    "_transitions",
    "_cmd_id",
    "_ranking",
    "_touched",
    "remainders",
    "_extra",
    "_changed_remainders",
)


class ClusterState(JobTransitions):
    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.nodes: dict[str, Node] = {}
        self.partitions: dict[str, c.PartitionDef] = {}
        self._partition_members: dict[str, frozenset[str] | None] = {}
        self.next_job_id = 1
        self.seq = 0  # event sequence number, increases with every emitted event
        # Submissions by cmd_id, so that a retried submit returns the same job.
        self.submissions: dict[str, int] = {}
        self.policy = Policy()
        # Array job id -> its tasks' job ids (pending ones of its remainder included); and
        # how many of them hold resources now (kept by `_move`, so the `%N` throttle is a
        # lookup, not a scan).
        self.array_tasks: dict[int, tuple[int, ...]] = {}
        self.array_active: dict[int, int] = {}
        # Derived: which job holds each array's pending remainder (arrays.py).
        self.remainders = arrays.Remainders()
        # Pending jobs per account (kept by `_move`), for MaxSubmitJobs at submit.
        self.waiting: dict[str, int] = {}
        # Fair share: account -> (decayed GPU-seconds, as of when).
        self.usage_gpu_s: dict[str, tuple[float, float]] = {}
        # Submit-time refusals by job shape: derived from the nodes, partitions and
        # policy, and dropped whenever one of them changes. Without it each submit
        # scans every node of the partition.
        self._satisfiable: dict[Any, str | None] = {}
        self._free: FreeMap | None = None  # derived, see free_map()
        self._future: Future | None = None  # derived from it, see future()
        self._gpus: int | None = None  # derived, see cluster_gpus()
        # Derived, see ranking(): built by the first pass (the leader's), then kept by
        # re-reading the jobs each command names (`touch`).
        self._ranking: PendingIndex | None = None
        self._touched: set[int] = set()
        self._cmd_id = ""  # the command being applied: its effects carry it
        # During one command: effects raised on the way (a task split off its remainder),
        # and the remainders it changed (each emits once, at the end).
        self._extra: list[Effect] = []
        self._changed_remainders: set[int] = set()
        self._handlers = self._handler_table()
        self._transitions = self.transition_table()

    def _handler_table(self) -> dict[type[c.Command], Callable[[Any], list[Effect]]]:
        return {
            c.ConfigurePartitions: self._configure_partitions,
            c.ConfigurePolicy: self._configure_policy,
            c.SubmitJob: lambda cmd: submit.submit(self, cmd),
            c.CancelJob: self._cancel,
            c.SignalJob: self._signal,
            c.HoldJob: lambda cmd: lifecycle.hold(self, cmd),
            c.ReleaseJob: lambda cmd: lifecycle.release(self, cmd),
            c.RequeueJob: lambda cmd: lifecycle.requeue(self, cmd),
            c.SuspendJob: lambda cmd: lifecycle.suspend(self, cmd),
            c.ResumeJob: lambda cmd: lifecycle.resume(self, cmd),
            c.Preempt: lambda cmd: lifecycle.preempt(self, cmd),
            c.RegisterNode: self._register_node,
            c.Allocate: lambda cmd: runs.allocate(self, cmd),
            c.JobStarted: lambda cmd: runs.started(self, cmd),
            c.JobFinished: lambda cmd: runs.finished(self, cmd),
            c.JobVanished: lambda cmd: runs.vanished(self, cmd),
            c.TimeLimitReached: lambda cmd: runs.time_limit(self, cmd),
            c.NodeLost: self._node_lost,
            c.DrainNode: self._drain_node,
            c.ResumeNode: self._resume_node,
            c.PurgeJobs: self._purge,
            c.CreateStep: lambda cmd: steps.create(self, cmd),
            c.StepFinished: lambda cmd: steps.finish(self, cmd),
            c.CancelStep: lambda cmd: steps.cancel(self, cmd),
            c.UpdateJob: lambda cmd: update.update(self, cmd),
        }

    def __getstate__(self) -> dict[str, Any]:
        # Raft snapshots pickle the state; the handler tables are code, not state.
        data = {k: v for k, v in self.__dict__.items() if k not in _NOT_STATE}
        data["_satisfiable"] = {}
        data["_free"] = None
        data["_future"] = None
        data["_gpus"] = None
        return data

    def __setstate__(self, data: dict[str, Any]) -> None:
        fresh = ClusterState()
        self.__dict__.update(fresh.__dict__)
        self.__dict__.update(data)
        self._handlers = self._handler_table()
        self._transitions = self.transition_table()
        self.waiting = {}
        for job in self.jobs.values():  # unpickled shapes are copies: share them again
            job.shape = interned(job.shape)
            if job.state is JobState.PENDING:
                self.waiting[job.account] = self.waiting.get(job.account, 0) + job.task_count
        self.remainders = arrays.Remainders.of(self.jobs)

    # -- the one entry point ------------------------------------------------------

    def apply(self, command: c.Command) -> list[Effect]:
        handler = self._handlers.get(type(command))
        if handler is None:
            raise Rejected(f"unknown command {type(command).__name__}")
        self._cmd_id = command.cmd_id
        try:
            effects = handler(command)
            if self._extra or self._changed_remainders:
                effects = self._with_remainders(effects, command.now)
        except Rejected:
            raise
        except Exception as exc:
            # A bug, or a command of an older journal that today's checks refuse at the
            # edge: refused, the same way on every replica, so the log replays on.
            raise Rejected(
                f"{type(command).__name__} {command.cmd_id} failed: {exc!r}", code=INTERNAL
            ) from exc
        finally:
            self._cmd_id = ""
            self._extra = []
            self._changed_remainders = set()
        if not isinstance(command, KEEPS_FREE_MAP) and not (
            isinstance(command, c.Allocate) and not command.placements  # reasons alone
        ):
            self._free = None
            self._future = None
        return effects

    def _with_remainders(self, effects: list[Effect], now: float) -> list[Effect]:
        """The command's effects, then those of tasks split off on the way, then one event
        per remainder the command changed (still pending: one started since has its own)."""
        out = [*effects, *self._extra]
        for job_id in sorted(self._changed_remainders):
            job = self.jobs.get(job_id)
            if job is not None and job.state is JobState.PENDING:
                out.append(self.emit(job, "remainder", now))
        return out

    def note_effects(self, effects: Iterable[Effect]) -> None:
        self._extra.extend(effects)

    def note_remainder(self, job_id: int) -> None:
        self._changed_remainders.add(job_id)

    def apply_each(self, commands: Iterable[c.Command]) -> list[list[Effect] | Rejected]:
        """Apply `commands` in order, each on its own (a `Batch`'s): each one's effects,
        or the refusal that left the state as it was before that command."""
        outcomes: list[list[Effect] | Rejected] = []
        for command in commands:
            try:
                outcomes.append(self.apply(command))
            except Rejected as exc:
                outcomes.append(exc)
        return outcomes

    def free_map(self) -> FreeMap:
        """What is free on every up node, for a planning pass: a copy (copy on write) of
        a map kept until a command changes what nodes hold. A burst of submissions
        schedules on one map instead of rebuilding it from every node per pass."""
        if self._free is None:
            self._free = FreeMap.of(self)
        return self._free.copy()

    def future(self, ends: Sequence[tuple[float, Allocs]]) -> Future:
        """The shadows of the future (`backfill.Future`) of the kept free map with these
        releases (soonest first), kept while neither changes."""
        if self._free is None:
            self._free = FreeMap.of(self)
        if self._future is None or not self._future.matches(self._free, ends):
            self._future = Future(self._free, ends)
        return self._future

    def cluster_gpus(self) -> int:
        """GPU devices on every registered node (priority's size factor), kept until a
        node registers."""
        if self._gpus is None:
            self._gpus = sum(len(n.spec.gpus) for n in self.nodes.values())
        return self._gpus

    def ranking(self, now: float) -> PendingIndex:
        """The pending jobs ranked between passes (`ranking.py`), current as of `now`
        (rebuilt for a `now` before the last one's: what time let start may not yet)."""
        if self._ranking is None or now < self._ranking.now:
            self._ranking = PendingIndex.of(self, now)
        else:
            self._ranking.refresh(self, self._touched, now)
        self._touched = set()
        return self._ranking

    def touch(self, job_id: int) -> None:
        """A job's state, reason, hold or request changed, or it came or went: the
        ranking re-reads it before the next pass. A replica that never planned keeps
        nothing."""
        if self._ranking is not None:
            self._touched.add(job_id)

    # -- queries ------------------------------------------------------------------

    @property
    def default_partition(self) -> str | None:
        for p in self.partitions.values():
            if p.default:
                return p.name
        return next(iter(self.partitions), None)

    def partition_nodes(self, partition: str) -> list[Node]:
        members = self._partition_members.get(partition)
        return [n for name, n in sorted(self.nodes.items()) if members is None or name in members]

    def node_partitions(self, node: str) -> list[str]:
        return [
            name
            for name, members in self._partition_members.items()
            if members is None or node in members
        ]

    @property
    def topology(self) -> dict[str, Any]:
        """The `[topology]` config, for placement."""
        return self.policy.topology

    def blocked_reason(self, job: Job, now: float) -> str | None:
        """Why `job` may not start whatever the resources (Dependency, BeginTime,
        JobHeldUser, JobArrayTaskLimit, ...), or None."""
        return lifecycle.blocked_reason(self, job, now)

    def wake_time(self, job: Job, now: float) -> float | None:
        """When a blocked job's reason may change with time alone (`lifecycle.wake_time`)."""
        return lifecycle.wake_time(self, job, now)

    def job_dict(
        self,
        job: Job,
        now: float,
        *,
        with_spec: bool = False,
        fields: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The job as the API shows it (cut to `fields` where given): `dependency` is
        squeue's %E as of `now`."""
        dependency = "(null)"
        if job.depends is not None and (fields is None or "dependency" in fields):
            dependency = deps.describe(job.depends, lifecycle.dependency_statuses(self, job, now))
        return job.to_dict(with_spec=with_spec, dependency=dependency, fields=fields)

    def job(self, job_id: int) -> Job:
        """The job `job_id` to read (a pending task of an array's remainder: a copy, so
        a command that refuses it changed nothing); `named` before changing it."""
        job = self.lookup(job_id)
        if job is None:
            raise Rejected(f"Invalid job id specified: {job_id}", code="not_found")
        return job

    def named(self, job_id: int, now: float) -> Job:
        """The job `job_id` to change: a task of an array's remainder leaves it first."""
        job = arrays.split(self, job_id, now)
        if job is None:
            raise Rejected(f"Invalid job id specified: {job_id}", code="not_found")
        return job

    def lookup(self, job_id: int) -> Job | None:
        """The job `job_id` as readers show it, wherever it is (`arrays.lookup`)."""
        return arrays.lookup(self, job_id)

    def listed(self, ids: Iterable[int] | None = None) -> Iterator[Job]:
        """Every job as readers list them, each pending task of a remainder on its own
        (copies); or only the jobs `ids` name, an array job's id naming all its tasks."""
        if ids is None:
            for job in self.jobs.values():
                yield from arrays.tasks_of(job)
            return
        named = set(ids)
        for job_id in ids:
            named.update(self.array_tasks.get(job_id, ()))
        for job_id in sorted(named):
            found = self.lookup(job_id)
            if found is not None:
                yield arrays.task_of(found, job_id) if found.array_pending else found

    def pending_jobs(self) -> list[Job]:
        """The pending records: a remainder once, for all its tasks."""
        return [j for j in self.jobs.values() if j.state is JobState.PENDING]

    def active_jobs(self) -> Iterable[Job]:
        return (j for j in self.jobs.values() if j.state.is_active)

    def set_reason(self, job: Job, reason: str, now: float, kind: str) -> list[Effect]:
        self.touch(job.job_id)  # a hold or release changes what it waits on, too
        if job.reason == reason:
            return []
        job.reason = reason
        return [self.emit(job, kind, now)]

    def redo_effects(self, cmd_id: str = "reconcile") -> list[Effect]:
        """What a new leader must (re)do for jobs in flight: launches that may not have
        reached their agent, signals of jobs still completing, and the current state of
        every active job for the event mirror. All of it is idempotent at the receiver."""
        self._cmd_id = cmd_id
        try:
            effects: list[Effect] = []
            for job in self.active_jobs():
                if job.state is JobState.RUNNING and job.pid is None:
                    effects.append(self.launch_effect(job))
                if job.state is JobState.COMPLETING:
                    effects.extend(self.signal_effects(job, SIGTERM, escalate=True))
                # A suspend or resume that may not have reached the agents (both are
                # idempotent there: a stopped job stopped again stays stopped).
                if job.state is JobState.SUSPENDED:
                    effects.extend(self.signal_effects(job, SIGSTOP))
                elif job.state is JobState.RUNNING and job.suspended_s:
                    effects.extend(self.signal_effects(job, SIGCONT))
                effects.append(
                    Emit(
                        job.job_id,
                        seq=job.seq,
                        kind="resync",
                        at=job.submit_time,
                        job=job.to_dict(),
                        cmd_id=cmd_id,
                    )
                )
            return effects
        finally:
            self._cmd_id = ""

    # -- partitions, policy and nodes ------------------------------------------------

    def _configure_partitions(self, cmd: c.ConfigurePartitions) -> list[Effect]:
        names = [p.name for p in cmd.partitions]
        if not names or len(set(names)) != len(names):
            raise Rejected("partitions need unique names")
        members: dict[str, frozenset[str] | None] = {}
        for p in cmd.partitions:
            if p.preempt_mode not in lifecycle.PARTITION_PREEMPT_MODES:
                raise Rejected(f"partition {p.name}: preempt_mode must be off, requeue or cancel")
            try:
                members[p.name] = (
                    None if p.nodes == "ALL" else frozenset(hostlist.expand_hostlist(p.nodes))
                )
            except hostlist.BadHostlist as exc:
                raise Rejected(f"partition {p.name}: bad node list {p.nodes!r}: {exc}") from exc
        self.partitions = {p.name: p for p in cmd.partitions}
        self._partition_members = members
        self._satisfiable.clear()
        return []

    def _configure_policy(self, cmd: c.ConfigurePolicy) -> list[Effect]:
        check_policy(cmd.policy)
        self.policy = cmd.policy
        self._satisfiable.clear()
        return []

    def _register_node(self, cmd: c.RegisterNode) -> list[Effect]:
        spec = cmd.node
        node = self.nodes.get(spec.name)
        if node is None or node.spec != spec:
            self._satisfiable.clear()
            self._gpus = None
        if node is None:
            self.nodes[spec.name] = Node(spec=spec, registered_at=cmd.now)
            return []
        if node.jobs and len(spec.gpus) != len(node.spec.gpus):
            raise Rejected(f"node {spec.name} changed its GPUs while jobs run on it")
        node.set_spec(spec)
        node.up = True
        node.reason = ""
        node.registered_at = cmd.now
        return []

    def _node_lost(self, cmd: c.NodeLost) -> list[Effect]:
        node = self.nodes.get(cmd.node)
        if node is None:
            raise Rejected(f"unknown node {cmd.node}")
        if not node.up:
            return []
        node.up = False
        node.reason = cmd.reason
        node.epoch += 1
        effects: list[Effect] = []
        for job_id in sorted(node.jobs):
            job = self.jobs[job_id]
            others = [n for n in job.allocation if n != cmd.node]
            effects.extend(self.signal_effects(job, SIGKILL, only=others))
            # Requeued only when it asked to be (--requeue); otherwise it failed here.
            end = JobState.PENDING if job.spec.requeue else JobState.NODE_FAIL
            effects.extend(self.transition(job, end, cmd.now))
        return effects

    def _drain_node(self, cmd: c.DrainNode) -> list[Effect]:
        node = self.nodes.get(cmd.node)
        if node is None:
            raise Rejected(f"Invalid node name specified: {cmd.node}", code="not_found")
        reason = cmd.reason.strip()
        if not reason or len(reason) > c.MAX_NODE_REASON or not reason.isprintable():
            raise Rejected(f"a drain needs a reason: 1 to {c.MAX_NODE_REASON} printable characters")
        node.drained, node.drain_reason = True, reason
        return []

    def _resume_node(self, cmd: c.ResumeNode) -> list[Effect]:
        node = self.nodes.get(cmd.node)
        if node is None:
            raise Rejected(f"Invalid node name specified: {cmd.node}", code="not_found")
        node.drained, node.drain_reason = False, ""
        return []

    # -- jobs ---------------------------------------------------------------------

    def refusal(self, shape: JobShape) -> str | None:
        """Why submit refuses a job of this shape (`placement.unsatisfiable`), memoised
        until the nodes, partitions or policy change."""
        if shape not in self._satisfiable:
            self._satisfiable[shape] = unsatisfiable(self, shape)
        return self._satisfiable[shape]

    def _cancel(self, cmd: c.CancelJob) -> list[Effect]:
        job = self.named(cmd.job_id, cmd.now)
        job.cancelled_by = cmd.by
        if job.state is JobState.PENDING:
            return self.transition(job, JobState.CANCELLED, cmd.now)
        if job.state in (JobState.RUNNING, JobState.SUSPENDED):
            return self.transition(
                job, JobState.COMPLETING, cmd.now, end_state=JobState.CANCELLED, kind="cancelling"
            )
        if job.state is JobState.COMPLETING and job.end_state is JobState.PENDING:
            job.end_state = JobState.CANCELLED  # stopping to be requeued: now it stays down
            return [self.emit(job, "cancelling", cmd.now)]
        return []  # already ending or ended: cancelling twice is not an error

    def _signal(self, cmd: c.SignalJob) -> list[Effect]:
        job = self.job(cmd.job_id)
        if job.state not in HOLDS_RESOURCES:
            raise Rejected(f"job {job.job_id} is not running", code="not_running")
        return list(self.signal_effects(job, cmd.signal))

    def _purge(self, cmd: c.PurgeJobs) -> list[Effect]:
        # Jobs that an active job depends on stay, so its dependency can still be judged.
        needed: set[int] = set()
        for j in self.active_jobs():
            for job_id in deps.referenced(j.depends):
                needed.add(job_id)
                needed.update(self.array_tasks.get(job_id, ()))
        gone = {
            j.job_id
            for j in self.jobs.values()
            if j.state.is_terminal
            and j.end_time is not None
            and j.end_time < cmd.ended_before
            and j.job_id not in needed
        }
        for job_id in gone:
            del self.jobs[job_id]
            self.touch(job_id)
        self.submissions = {k: v for k, v in self.submissions.items() if v not in gone}
        for array_id, tasks in list(self.array_tasks.items()):
            left = tuple(t for t in tasks if t not in gone)
            if left:
                self.array_tasks[array_id] = left
            else:
                del self.array_tasks[array_id]
                self.array_active.pop(array_id, None)
        return []

    # -- invariants and snapshots --------------------------------------------------

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the first one broken."""
        invariants.validate(self)

    def snapshot(self) -> dict[str, Any]:
        return {
            "next_job_id": self.next_job_id,
            "seq": self.seq,
            "partitions": [vars(p) for p in self.partitions.values()],
            "nodes": {n: node.to_dict() for n, node in sorted(self.nodes.items())},
            "jobs": {str(j): job.to_dict(with_spec=True) for j, job in sorted(self.jobs.items())},
            "submissions": dict(sorted(self.submissions.items())),
            "policy": self.policy.to_dict(),
            "usage_gpu_s": {a: list(v) for a, v in sorted(self.usage_gpu_s.items())},
            "array_tasks": {str(a): list(t) for a, t in sorted(self.array_tasks.items())},
            "array_active": {str(a): n for a, n in sorted(self.array_active.items())},
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.snapshot(), sort_keys=True, separators=(",", ":")).encode()


__all__ = ["ClusterState", "NodeAlloc", "Rejected"]
