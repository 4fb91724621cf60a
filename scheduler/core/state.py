"""`ClusterState`: the replicated state machine of the controller.

`apply(command) -> list[Effect]` is the only way the state changes. It is deterministic:
replicas applying the same commands in the same order reach the same bytes
(`to_bytes()`). A command the state refuses raises `Rejected` before anything changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import hostlist

from scheduler.core import commands as c
from scheduler.core.effects import Effect, Emit, Launch, Signal
from scheduler.core.errors import Rejected
from scheduler.core.jobs import HOLDS_RESOURCES, TRANSITIONS, Job, JobState, NodeAlloc
from scheduler.core.nodes import Node

SIGKILL = 9
SIGTERM = 15

NOT_AVAILABLE = "Requested node configuration is not available"


class ClusterState:
    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.nodes: dict[str, Node] = {}
        self.partitions: dict[str, c.PartitionDef] = {}
        self._partition_members: dict[str, frozenset[str] | None] = {}
        self.next_job_id = 1
        self.seq = 0  # event sequence number, increases with every emitted event
        # Submissions by cmd_id, so that a retried submit returns the same job.
        self.submissions: dict[str, int] = {}
        self._handlers: dict[type[c.Command], Callable[[Any], list[Effect]]] = {
            c.ConfigurePartitions: self._configure_partitions,
            c.SubmitJob: self._submit,
            c.CancelJob: self._cancel,
            c.SignalJob: self._signal,
            c.RegisterNode: self._register_node,
            c.Allocate: self._allocate,
            c.JobStarted: self._started,
            c.JobFinished: self._finished,
            c.TimeLimitReached: self._time_limit,
            c.NodeLost: self._node_lost,
            c.PurgeJobs: self._purge,
        }

    def __getstate__(self) -> dict[str, Any]:
        # Raft snapshots pickle the state; the handler table is code, not state.
        data = dict(self.__dict__)
        del data["_handlers"]
        return data

    def __setstate__(self, data: dict[str, Any]) -> None:
        fresh = ClusterState()
        self.__dict__.update(fresh.__dict__)
        self.__dict__.update(data)
        self._handlers = {k: getattr(self, v.__name__) for k, v in fresh._handlers.items()}

    # -- the one entry point ------------------------------------------------------

    def apply(self, command: c.Command) -> list[Effect]:
        handler = self._handlers.get(type(command))
        if handler is None:
            raise Rejected(f"unknown command {type(command).__name__}")
        return handler(command)

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

    def pending_jobs(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state is JobState.PENDING]

    def active_jobs(self) -> Iterable[Job]:
        return (j for j in self.jobs.values() if j.state.is_active)

    def redo_effects(self) -> list[Effect]:
        """What a new leader must (re)do for jobs in flight: launches that may not have
        reached their agent, signals of jobs still completing, and the current state of
        every active job for the event mirror. All of it is idempotent at the receiver."""
        effects: list[Effect] = []
        for job in self.active_jobs():
            if job.state is JobState.RUNNING and job.pid is None:
                effects.append(self._launch_effect(job))
            if job.state is JobState.COMPLETING:
                effects.extend(self._signal_effects(job, SIGTERM, escalate=True))
            effects.append(
                Emit(job.job_id, seq=job.seq, kind="resync", at=job.submit_time, job=job.to_dict())
            )
        return effects

    # -- partitions and nodes ------------------------------------------------------

    def _configure_partitions(self, cmd: c.ConfigurePartitions) -> list[Effect]:
        names = [p.name for p in cmd.partitions]
        if not names or len(set(names)) != len(names):
            raise Rejected("partitions need unique names")
        members: dict[str, frozenset[str] | None] = {}
        for p in cmd.partitions:
            try:
                members[p.name] = (
                    None if p.nodes == "ALL" else frozenset(hostlist.expand_hostlist(p.nodes))
                )
            except hostlist.BadHostlist as exc:
                raise Rejected(f"partition {p.name}: bad node list {p.nodes!r}: {exc}") from exc
        self.partitions = {p.name: p for p in cmd.partitions}
        self._partition_members = members
        return []

    def _register_node(self, cmd: c.RegisterNode) -> list[Effect]:
        spec = cmd.node
        node = self.nodes.get(spec.name)
        if node is None:
            self.nodes[spec.name] = Node(spec=spec, registered_at=cmd.now)
            return []
        if node.jobs and len(spec.gpus) != len(node.spec.gpus):
            raise Rejected(f"node {spec.name} changed its GPUs while jobs run on it")
        node.spec = spec
        if len(node.gpu_owner) != len(spec.gpus):
            node.gpu_owner = [None] * len(spec.gpus)
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
        effects: list[Effect] = []
        for job_id in sorted(node.jobs):
            job = self.jobs[job_id]
            others = [n for n in job.allocation if n != cmd.node]
            effects.extend(self._signal_effects(job, SIGKILL, only=others))
            if job.spec.requeue:
                effects.extend(self._requeue(job, cmd.now))
            else:
                effects.extend(self._end(job, JobState.NODE_FAIL, cmd.now, exit_code=0, signal=0))
        return effects

    # -- jobs ---------------------------------------------------------------------

    def _submit(self, cmd: c.SubmitJob) -> list[Effect]:
        known = self.submissions.get(cmd.cmd_id)
        if known is not None:
            return []
        spec = cmd.spec
        if not self.partitions:
            raise Rejected("the cluster has no partitions configured yet", code="unavailable")
        partition = spec.partition or self.default_partition or ""
        part = self.partitions.get(partition)
        if part is None:
            raise Rejected("Invalid partition name specified", code="invalid_partition")
        time_limit = spec.time_limit_min
        if time_limit is None:
            time_limit = part.default_time_min if part.default_time_min else part.max_time_min
        elif part.max_time_min is not None and time_limit > part.max_time_min:
            raise Rejected(
                "Requested time limit is invalid (missing or exceeds some limit)",
                code="time_limit",
            )
        self._check_satisfiable(spec, partition)
        job = Job(
            job_id=self.next_job_id,
            spec=spec,
            partition=partition,
            account=spec.account or spec.tenant or "root",
            time_limit_min=time_limit,
            submit_time=cmd.now,
            eligible_time=cmd.now,
        )
        self.next_job_id += 1
        self.jobs[job.job_id] = job
        self.submissions[cmd.cmd_id] = job.job_id
        return [self._emit(job, "submitted", cmd.now)]

    def _check_satisfiable(self, spec: Any, partition: str) -> None:
        """Refuse at submit what no state of this partition could ever run
        (EnforcePartLimits=ALL): the user hears it now, not after a day in the queue."""
        nodes = self.partition_nodes(partition)
        if spec.gpu_type:
            models = sorted({g.model for n in nodes for g in n.spec.gpus})
            if spec.gpu_type not in models:
                listed = ", ".join(models) or "none"
                raise Rejected(
                    f"{NOT_AVAILABLE}: unknown GPU type '{spec.gpu_type}' "
                    f"(partition {partition} has: {listed})",
                    code="unsatisfiable",
                )
        want_gpus = spec.gpus_on_each_node
        want_cpus = spec.cpus_on_each_node
        fitting = [
            n
            for n in nodes
            if len(n.gpus_of_model(spec.gpu_type)) >= want_gpus
            and n.spec.cpus >= want_cpus
            and (spec.mem_per_node_mb is None or n.spec.memory_mb >= spec.mem_per_node_mb)
        ]
        if len(fitting) >= spec.nodes:
            return
        if not nodes:
            detail = f"partition {partition} has no nodes"
        elif want_gpus > max(len(n.gpus_of_model(spec.gpu_type)) for n in nodes):
            most = max(len(n.gpus_of_model(spec.gpu_type)) for n in nodes)
            kind = f" {spec.gpu_type}" if spec.gpu_type else ""
            detail = f"{want_gpus}{kind} GPUs per node requested, the largest node has {most}"
        elif want_cpus > max(n.spec.cpus for n in nodes):
            detail = f"{want_cpus} CPUs per node requested, the largest node has " + str(
                max(n.spec.cpus for n in nodes)
            )
        elif spec.mem_per_node_mb is not None and spec.mem_per_node_mb > max(
            n.spec.memory_mb for n in nodes
        ):
            most_mem = max(n.spec.memory_mb for n in nodes)
            detail = f"{spec.mem_per_node_mb}M memory per node requested, the largest node has "
            detail += f"{most_mem}M"
        else:
            detail = f"{spec.nodes} nodes requested, partition {partition} has {len(fitting)} "
            detail += "that fit"
        raise Rejected(f"{NOT_AVAILABLE}: {detail}", code="unsatisfiable")

    def _cancel(self, cmd: c.CancelJob) -> list[Effect]:
        job = self._job(cmd.job_id)
        job.cancelled_by = cmd.by
        if job.state is JobState.PENDING:
            return self._end(job, JobState.CANCELLED, cmd.now, exit_code=0, signal=0)
        if job.state is JobState.RUNNING:
            self._move(job, JobState.COMPLETING)
            job.end_state = JobState.CANCELLED
            job.end_time = cmd.now
            return [
                *self._signal_effects(job, SIGTERM, escalate=True),
                self._emit(job, "cancelling", cmd.now),
            ]
        return []  # already ending or ended: cancelling twice is not an error

    def _signal(self, cmd: c.SignalJob) -> list[Effect]:
        job = self._job(cmd.job_id)
        if job.state not in HOLDS_RESOURCES:
            raise Rejected(f"job {job.job_id} is not running", code="not_running")
        return list(self._signal_effects(job, cmd.signal))

    def _time_limit(self, cmd: c.TimeLimitReached) -> list[Effect]:
        job = self._job(cmd.job_id)
        if job.state is not JobState.RUNNING or job.attempt != cmd.attempt:
            return []
        self._move(job, JobState.COMPLETING)
        job.end_state = JobState.TIMEOUT
        job.end_time = cmd.now
        return [
            *self._signal_effects(job, SIGTERM, escalate=True),
            self._emit(job, "timeout", cmd.now),
        ]

    def _allocate(self, cmd: c.Allocate) -> list[Effect]:
        effects: list[Effect] = []
        for placement in cmd.placements:
            job = self.jobs.get(placement.job_id)
            if job is None or job.state is not JobState.PENDING or not placement.nodes:
                continue  # a stale plan: the job was cancelled or placed meanwhile
            if not self._placement_fits(job, placement):
                continue
            for name, alloc in placement.nodes:
                self.nodes[name].take(job.job_id, alloc)
            job.allocation = dict(placement.nodes)
            job.attempt += 1
            job.pid = None
            job.started_at = None
            job.start_time = cmd.now
            job.end_time = None
            job.reason = "None"
            self._move(job, JobState.RUNNING)
            effects.append(self._launch_effect(job))
            effects.append(self._emit(job, "allocated", cmd.now))
        for job_id, reason in cmd.reasons:
            job = self.jobs.get(job_id)
            if job is not None and job.state is JobState.PENDING and job.reason != reason:
                job.reason = reason
                effects.append(self._emit(job, "pending", cmd.now))
        return effects

    def _placement_fits(self, job: Job, placement: c.Placement) -> bool:
        names = [n for n, _ in placement.nodes]
        if len(set(names)) != len(names) or len(names) != job.spec.nodes:
            return False
        members = set(n.name for n in self.partition_nodes(job.partition))
        for name, alloc in placement.nodes:
            node = self.nodes.get(name)
            if node is None or name not in members or not node.fits(alloc):
                return False
            if len(alloc.gpus) != job.spec.gpus_on_each_node:
                return False
            if job.spec.gpu_type and any(
                node.spec.gpus[g].model != job.spec.gpu_type for g in alloc.gpus
            ):
                return False
        return True

    def _started(self, cmd: c.JobStarted) -> list[Effect]:
        job = self.jobs.get(cmd.job_id)
        if job is None or job.attempt != cmd.attempt or job.state not in HOLDS_RESOURCES:
            return []  # stale report of an earlier attempt: acknowledged, ignored
        if job.pid is not None:
            return []
        job.pid = cmd.pid
        job.started_at = cmd.now
        return [self._emit(job, "started", cmd.now)]

    def _finished(self, cmd: c.JobFinished) -> list[Effect]:
        job = self.jobs.get(cmd.job_id)
        if job is None or job.attempt != cmd.attempt or job.state not in HOLDS_RESOURCES:
            return []
        if job.nodes and cmd.node != job.nodes[0]:
            return []  # only the batch host's report ends the job
        if job.state is JobState.COMPLETING and job.end_state is not None:
            final = job.end_state
        elif cmd.exit_code == 0 and cmd.signal == 0:
            final = JobState.COMPLETED
        else:
            final = JobState.FAILED
        if cmd.reason and final is JobState.FAILED:
            job.reason = cmd.reason
        return self._end(job, final, cmd.now, exit_code=cmd.exit_code, signal=cmd.signal)

    def _purge(self, cmd: c.PurgeJobs) -> list[Effect]:
        gone = {
            j.job_id
            for j in self.jobs.values()
            if j.state.is_terminal and j.end_time is not None and j.end_time < cmd.ended_before
        }
        for job_id in gone:
            del self.jobs[job_id]
        self.submissions = {k: v for k, v in self.submissions.items() if v not in gone}
        return []

    # -- transitions -----------------------------------------------------------------

    def _move(self, job: Job, to: JobState) -> None:
        if (job.state, to) not in TRANSITIONS:
            raise AssertionError(f"job {job.job_id}: illegal transition {job.state} -> {to}")
        job.state = to

    def _end(
        self, job: Job, final: JobState, now: float, *, exit_code: int, signal: int
    ) -> list[Effect]:
        self._release(job)
        self._move(job, final)
        job.exit_code = exit_code
        job.signal = signal
        job.end_state = None
        if job.end_time is None or final is not JobState.CANCELLED:
            job.end_time = now
        if job.start_time is None:
            job.start_time = now if final is not JobState.CANCELLED else None
        return [self._emit(job, "finished", now)]

    def _requeue(self, job: Job, now: float) -> list[Effect]:
        self._release(job)
        self._move(job, JobState.PENDING)
        job.allocation = {}
        job.pid = None
        job.started_at = None
        job.end_state = None
        job.start_time = None
        job.reason = "None"
        job.eligible_time = now
        return [self._emit(job, "requeued", now)]

    def _release(self, job: Job) -> None:
        for name, alloc in job.allocation.items():
            node = self.nodes.get(name)
            if node is not None:
                node.give_back(job.job_id, alloc)

    def _job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise Rejected(f"Invalid job id specified: {job_id}", code="not_found")
        return job

    # -- effects ----------------------------------------------------------------------

    def _emit(self, job: Job, kind: str, now: float) -> Emit:
        self.seq += 1
        job.seq = self.seq
        return Emit(job.job_id, seq=self.seq, kind=kind, at=now, job=job.to_dict())

    def _launch_effect(self, job: Job) -> Launch:
        first = job.nodes[0]
        return Launch(
            job.job_id,
            attempt=job.attempt,
            node=first,
            agent_url=self.nodes[first].spec.agent_url,
            job=job.to_dict(with_spec=True),
        )

    def _signal_effects(
        self, job: Job, signal: int, *, escalate: bool = False, only: list[str] | None = None
    ) -> list[Effect]:
        targets = job.nodes if only is None else only
        return [
            Signal(
                job.job_id,
                attempt=job.attempt,
                node=name,
                agent_url=self.nodes[name].spec.agent_url,
                signal=signal,
                escalate=escalate,
            )
            for name in targets
            if name in self.nodes
        ]

    # -- invariants and snapshots --------------------------------------------------

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the first one broken."""
        owners: dict[tuple[str, int], int] = {}
        cpus: dict[str, int] = {n: 0 for n in self.nodes}
        mem: dict[str, int] = {n: 0 for n in self.nodes}
        for job in self.jobs.values():
            if job.state in HOLDS_RESOURCES:
                assert job.allocation, f"job {job.job_id} {job.state} without allocation"
                assert job.attempt >= 1
                for name, alloc in job.allocation.items():
                    assert name in self.nodes, f"job {job.job_id} on unknown node {name}"
                    assert self.nodes[name].up or job.state is JobState.COMPLETING, (
                        f"running job {job.job_id} on down node {name}"
                    )
                    for g in alloc.gpus:
                        key = (name, g)
                        assert key not in owners, f"GPU {name}:{g} in jobs {owners.get(key)}"
                        owners[key] = job.job_id
                    cpus[name] += alloc.cpus
                    mem[name] += alloc.mem_mb
            else:
                for name in job.allocation:
                    node = self.nodes.get(name)
                    assert node is None or job.job_id not in node.jobs, (
                        f"{job.state} job {job.job_id} still holds {name}"
                    )
            if job.state is JobState.PENDING:
                assert not job.allocation, f"pending job {job.job_id} holds resources"
        for name, node in self.nodes.items():
            for g, owner in enumerate(node.gpu_owner):
                assert owners.get((name, g)) == owner, f"GPU {name}:{g} owner {owner} is stale"
            assert node.cpus_alloc == cpus[name], f"node {name} cpus_alloc drifted"
            assert node.mem_alloc_mb == mem[name], f"node {name} mem_alloc drifted"
            assert 0 <= node.cpus_alloc <= node.spec.cpus, f"node {name} CPUs overcommitted"
            assert 0 <= node.mem_alloc_mb <= node.spec.memory_mb, f"node {name} memory over"
        assert all(j < self.next_job_id for j in self.jobs)

    def snapshot(self) -> dict[str, Any]:
        return {
            "next_job_id": self.next_job_id,
            "seq": self.seq,
            "partitions": [vars(p) for p in self.partitions.values()],
            "nodes": {n: node.to_dict() for n, node in sorted(self.nodes.items())},
            "jobs": {str(j): job.to_dict(with_spec=True) for j, job in sorted(self.jobs.items())},
            "submissions": dict(sorted(self.submissions.items())),
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.snapshot(), sort_keys=True, separators=(",", ":")).encode()


__all__ = ["ClusterState", "NodeAlloc", "Rejected"]
