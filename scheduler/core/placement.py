"""Planning a scheduling pass: which pending jobs start where, with exact GPU indices.

`plan()` is pure: it reads the state, never changes it, and returns the `Allocate`
command the leader proposes to Raft. `ClusterState` re-checks every placement when the
command is applied, so a plan made on a state that moved on is dropped, never applied
twice.

This is first fit in priority order (submit order today): every job that fits starts,
so a large blocked job does not idle the GPUs behind it. Topology-aware scoring and
backfill reservations come with the next placement policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.commands import Allocate, Placement
from scheduler.core.jobs import Job, NodeAlloc
from scheduler.core.nodes import Node
from scheduler.core.state import ClusterState


@dataclass
class _Free:
    """Scratch copy of what a node has free during one pass."""

    gpus: list[int]
    models: dict[int, str]
    cpus: int
    mem_mb: int
    taken: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, node: Node) -> _Free:
        return cls(
            gpus=node.free_gpus(),
            models={g.index: g.model for g in node.spec.gpus},
            cpus=node.cpus_free,
            mem_mb=node.mem_free_mb,
        )

    def pick(self, count: int, model: str) -> tuple[int, ...] | None:
        choice = [g for g in self.gpus if not model or self.models[g] == model][:count]
        return tuple(choice) if len(choice) == count else None


def plan(state: ClusterState, *, now: float, cmd_id: str) -> Allocate | None:
    free = {name: _Free.of(node) for name, node in state.nodes.items() if node.up}
    placements: list[Placement] = []
    reasons: list[tuple[int, str]] = []
    for job in sorted(state.pending_jobs(), key=lambda j: j.job_id):
        chosen = _first_fit(state, job, free)
        if chosen is None:
            if job.reason != "Resources":
                reasons.append((job.job_id, "Resources"))
            continue
        for name, alloc in chosen:
            scratch = free[name]
            scratch.gpus = [g for g in scratch.gpus if g not in alloc.gpus]
            scratch.cpus -= alloc.cpus
            scratch.mem_mb -= alloc.mem_mb
        placements.append(Placement(job.job_id, tuple(chosen)))
    if not placements and not reasons:
        return None
    return Allocate(cmd_id=cmd_id, now=now, placements=tuple(placements), reasons=tuple(reasons))


def _first_fit(
    state: ClusterState, job: Job, free: dict[str, _Free]
) -> list[tuple[str, NodeAlloc]] | None:
    spec = job.spec
    gpus = spec.gpus_on_each_node
    cpus = spec.cpus_on_each_node
    chosen: list[tuple[str, NodeAlloc]] = []
    for node in state.partition_nodes(job.partition):
        scratch = free.get(node.name)
        if scratch is None:
            continue
        mem = node.mem_for(spec.mem_per_node_mb, cpus)
        if scratch.cpus < cpus or scratch.mem_mb < mem:
            continue
        picked = scratch.pick(gpus, spec.gpu_type)
        if picked is None:
            continue
        chosen.append((node.name, NodeAlloc(gpus=picked, cpus=cpus, mem_mb=mem)))
        if len(chosen) == spec.nodes:
            return chosen
    return None
