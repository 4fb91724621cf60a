"""Where a job fits: `place()` on a `FreeMap`, the submit-time check, and (until the
planner takes it over) a first-come-first-served `plan()`.

`place` is pure: it reads the state and the free map and returns the allocation, or
None. Choices, in order: the nodes the job may use (partition, `--constraint`,
`--nodelist`, `--exclude`, `--exclusive`); for one node, the best fit (fewest whole GPUs
left over, already shared GPUs before whole ones); for a gang, the lowest switch or the
fewest blocks; within a node, `devicechoice` (links, NUMA, CPU binding).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from scheduler.core.contract import MILLI, JobShape, JobSpec
from scheduler.core.devicechoice import bind_cpus, choose_gpus, choose_share
from scheduler.core.fragmentation import TaskMix, TaskShape, fragmented_milli, grow_of
from scheduler.core.freemap import ANY, FreeMap, NodeFree
from scheduler.core.jobs import Job, NodeAlloc
from scheduler.core.nodes import Node
from scheduler.core.policy import Policy
from scheduler.core.resources import NodeSpec
from scheduler.core.topology import Topology


class PlacementView(Protocol):
    """What placement reads of the state: its nodes by partition, the topology config and
    the policy (shards per GPU)."""

    @property
    def policy(self) -> Policy: ...
    @property
    def topology(self) -> dict[str, Any]: ...

    def partition_nodes(self, partition: str) -> list[Node]: ...


NOT_AVAILABLE = "Requested node configuration is not available"

Allocation = tuple[tuple[str, NodeAlloc], ...]


def shape_of(state: PlacementView, spec: JobSpec, partition: str) -> JobShape:
    """The spec's shape under the state's policy (its shards per GPU)."""
    return JobShape.of(spec, partition, shards_per_gpu=state.policy.shards_per_gpu)


def features_match(constraint: str, features: Sequence[str]) -> bool:
    """`a`, `a&b` (also `a,b`), `a|b`; `&` binds tighter than `|`, as in Slurm."""
    if not constraint:
        return True
    have = {f.lower() for f in features}
    for alternative in constraint.lower().split("|"):
        wanted = [w.strip() for w in alternative.replace(",", "&").split("&") if w.strip()]
        if all(w in have for w in wanted):
            return True
    return False


def node_features(spec: NodeSpec) -> tuple[str, ...]:
    # GPU models and vendors count as features even when an agent did not list them.
    return (*spec.features, *(g.model for g in spec.gpus), *(g.vendor for g in spec.gpus))


def _eligible(state: PlacementView, free: FreeMap, req: JobShape) -> bytes:
    key = req.where
    cached = free.statics.get(key)
    if cached is None:
        members = {n.name for n in state.partition_nodes(req.partition)}
        listed, excluded = set(req.nodelist), set(req.exclude)
        cached = bytes(
            view.name in members
            and view.name not in excluded
            and (not listed or view.name in listed)
            and features_match(req.constraint, node_features(view.spec))
            for view in free.nodes
        )
        free.statics[key] = cached
    return cached


def _mem(spec: NodeSpec, requested: int | None, cpus: int) -> int:
    if requested is None:
        return cpus * (spec.memory_mb // spec.cpus)
    return requested or spec.memory_mb


def fit_on(view: NodeFree, req: JobShape, *, share_free: int = 0) -> NodeAlloc | None:
    """The allocation for one node of the request on this node, or None. `share_free`:
    take a share from a device with exactly that much free (see `choose_share`)."""
    if req.exclusive:
        if view.allocs:
            return None
        cpus, mem = view.spec.cpus, view.spec.memory_mb
    else:
        cpus = req.resources.cpus_per_node
        mem = _mem(view.spec, req.resources.mem_per_node_mb, cpus)
    if cpus > view.cpus or mem > view.mem_mb:
        return None
    milli: tuple[int, ...] = ()
    if req.resources.gpus_per_node:
        whole = view.whole_free(req.resources.gpu_type)
        if len(whole) < req.resources.gpus_per_node:
            return None
        gpus = choose_gpus(view.shape, tuple(whole), req.resources.gpus_per_node)
    elif req.resources.gpu_milli_per_node:
        device = choose_share(
            view, req.resources.gpu_type, req.resources.gpu_milli_per_node, free=share_free
        )
        if device is None:
            return None
        gpus, milli = (device,), (req.resources.gpu_milli_per_node,)
    else:
        gpus = ()
    return NodeAlloc(
        gpus=gpus, cpus=cpus, mem_mb=mem, gpu_milli=milli, cpu_ids=bind_cpus(view, gpus, cpus)
    )


def _walk(free: FreeMap, req: JobShape, ok: bytes) -> Iterator[int]:
    """Ordinals that may hold one node of the request, best fit first, lazily: most
    single-node calls stop in the first bucket they look at."""
    seen: set[int] = set()
    if req.resources.gpu_milli_per_node:
        # Already shared devices, the smallest leftover that holds the share first.
        entries = free.partial.get(req.resources.gpu_type, [])
        for _, o, _ in entries[bisect_left(entries, (req.resources.gpu_milli_per_node, -1, -1)) :]:
            if ok[o] and o not in seen:
                seen.add(o)
                yield o
    # Then nodes by how many whole devices they have free: the fewest that suffice.
    buckets = free.whole.get(
        req.resources.gpu_type
        if (req.resources.gpus_per_node or req.resources.gpu_milli_per_node)
        else ANY,
        [],
    )
    for bucket in buckets[
        req.resources.gpus_per_node or (1 if req.resources.gpu_milli_per_node else 0) :
    ]:
        for o in bucket:
            if ok[o] and o not in seen:
                yield o


def place(
    state: PlacementView,
    job: Job,
    free: FreeMap,
    *,
    topology: Topology | None = None,
    mix: TaskMix | Sequence[tuple[JobShape, float]] | None = None,
) -> Allocation | None:
    """Where `job` fits on `free` now (all of its nodes, or None); `free` is unchanged.

    With a typical task `mix` (`task_mix`), a one-node job goes to the node, and the
    device, whose fragmentation grows least (FGD, ATC'23); without one, best fit."""
    return place_shape(state, job.shape, free, topology=topology, mix=mix)


def place_shape(
    state: PlacementView,
    req: JobShape,
    free: FreeMap,
    *,
    topology: Topology | None = None,
    mix: TaskMix | Sequence[tuple[JobShape, float]] | None = None,
) -> Allocation | None:
    """`place` for any job of this shape: jobs of one shape place alike."""
    ok = _eligible(state, free, req)
    if req.nodelist:
        return _place_listed(free, req, ok)
    if req.resources.nodes == 1:
        if mix:
            return _least_fragmenting(free, req, ok, as_mix(mix))
        # The walk stops at the first fit: the candidates come best fit first.
        for o in _walk(free, req, ok):
            alloc = fit_on(free.nodes[o], req)
            if alloc is not None:
                return ((free.nodes[o].name, alloc),)
        return None
    topo = topology if topology is not None else _pass_topology(state, free)
    if topo is None or not (topo.switches or topo.blocks):
        # No switches or blocks to prefer: the first nodes that fit in best-fit order, found lazily
        # (on a shadow of the future most of the cluster fits, and one fit_on binds CPUs).
        chosen: list[tuple[str, NodeAlloc]] = []
        for o in _walk(free, req, ok):
            alloc = fit_on(free.nodes[o], req)
            if alloc is not None:
                chosen.append((free.nodes[o].name, alloc))
                if len(chosen) == req.resources.nodes:
                    return tuple(chosen)
        return None
    fitting: dict[str, NodeAlloc] = {}
    for o in _walk(free, req, ok):
        alloc = fit_on(free.nodes[o], req)
        if alloc is not None:
            fitting[free.nodes[o].name] = alloc
    if len(fitting) < req.resources.nodes:
        return None
    groups = topo.groups(list(fitting), req.resources.nodes)
    if not groups:
        return None
    return tuple((name, fitting[name]) for name in groups[0][: req.resources.nodes])


def _least_fragmenting(free: FreeMap, req: JobShape, ok: bytes, mix: TaskMix) -> Allocation | None:
    """Every node that may hold the request is scored, one score per group of nodes
    alike in the same state (a memo look-up when that state was seen before). The
    smallest growth wins, then the earliest in best-fit order (`_rank`), so between
    equal choices whole GPUs and whole nodes stay free as without a mix."""
    best: tuple[float, tuple[int, int], int, int] | None = None
    if req.exclusive:
        # Only empty nodes, rare: each one simulated.
        for rank, o in enumerate(_walk(free, req, ok)):
            scored = _simulated(free.nodes[o], req, mix)
            if scored is not None and (best is None or scored[0] < best[0]):
                best = (scored[0], (0, rank), o, scored[1])
        return _fit_best(free, req, best)
    task = TaskShape.of(req)
    tid = mix.task_id(task)
    for group in free.groups.values():
        scored = mix.score(group, task, tid)
        if scored is None or (best is not None and scored[0] > best[0]):
            continue
        members = group.members
        o = members[0] if ok[members[0]] else next((m for m in members if ok[m]), -1)
        if o < 0:
            continue
        candidate = (scored[0], _rank(req, group.sig[0][1]), o, scored[1])
        if best is None or candidate[:3] < best[:3]:
            best = candidate
    for o in free.unalike:
        view = free.nodes[o]
        scored = _simulated(view, req, mix) if ok[o] else None
        if scored is None:
            continue
        frees = tuple(
            view.free_milli(d)
            for d, k in enumerate(view.shape.kinds)
            if req.resources.gpu_type in k
        )
        candidate = (scored[0], _rank(req, frees), o, scored[1])
        if best is None or candidate[:3] < best[:3]:
            best = candidate
    return _fit_best(free, req, best)


def _rank(req: JobShape, frees: tuple[int, ...]) -> tuple[int, int]:
    # Where `_walk` would meet the node (ties then go to the lower ordinal): a share
    # first on shared devices by the smallest leftover that holds it, then by how
    # many whole devices are free, the fewest first.
    if req.resources.gpu_milli_per_node:
        shared = [f for f in frees if req.resources.gpu_milli_per_node <= f < MILLI]
        if shared:
            return (0, min(shared))
    return (1, sum(1 for f in frees if f == MILLI))


def _fit_best(
    free: FreeMap, req: JobShape, best: tuple[float, tuple[int, int], int, int] | None
) -> Allocation | None:
    if best is None:
        return None
    view = free.nodes[best[2]]
    alloc = fit_on(view, req, share_free=max(0, best[3]))
    return None if alloc is None else ((view.name, alloc),)


def _simulated(view: NodeFree, req: JobShape, mix: TaskMix) -> tuple[float, int] | None:
    # Devices not alike (partitions with parents, mixed kinds), or an exclusive job:
    # the growth of the allocation fit_on would make, held on a scratch copy, so
    # partitions blocked by their parent (and the reverse) count as they will.
    alloc = fit_on(view, req)
    if alloc is None:
        return None
    used, blocked = list(view.used), list(view.blocked)
    for i, d in enumerate(alloc.gpus):
        if not used[d]:
            for r in view.shape.related[d]:
                blocked[r] += 1
        used[d] += alloc.milli(i)
    frees = [0 if blocked[d] else MILLI - used[d] for d in range(len(used))]
    grow = grow_of(mix, view, frees, alloc.cpus, alloc.mem_mb)
    return (grow, view.free_milli(alloc.gpus[0]) if req.resources.gpu_milli_per_node else -1)


def _place_listed(free: FreeMap, req: JobShape, ok: bytes) -> Allocation | None:
    """--nodelist: every listed node is in the job (Slurm), the rest best fit."""
    if len(req.nodelist) > req.resources.nodes:
        return None
    chosen: list[tuple[str, NodeAlloc]] = []
    for name in sorted(set(req.nodelist)):
        view = free.node(name)
        alloc = fit_on(view, req) if view is not None and ok[view.ordinal] else None
        if alloc is None:
            return None
        chosen.append((name, alloc))
    if len(chosen) < req.resources.nodes:
        return None  # eligibility already limits a listed job to its list
    return tuple(chosen)


def _pass_topology(state: PlacementView, free: FreeMap) -> Topology | None:
    # Parsed once per pass: the free map's static cache lives as long as the pass.
    key = ("topology",)
    if key not in free.statics:
        free.statics[key] = topology_of(state)
    topo: Topology | None = free.statics[key]
    return topo


def topology_of(state: PlacementView) -> Topology | None:
    return Topology.from_config(state.topology)


def allocation_fits(job: Job, node: Node, alloc: NodeAlloc) -> bool:
    """Re-check of a planned allocation when the Allocate is applied: the node can take
    it now and it is the shape the job asked for."""
    req = job.shape
    if not node.fits(alloc):
        return False
    if not features_match(req.constraint, node_features(node.spec)):
        return False
    if node.name in req.exclude or (req.nodelist and node.name not in req.nodelist):
        return False
    if req.exclusive and node.jobs:
        return False
    devices = node.spec.gpus
    if req.resources.gpus_per_node:
        return (
            len(alloc.gpus) == req.resources.gpus_per_node
            and all(alloc.milli(i) == MILLI for i in range(len(alloc.gpus)))
            and all(
                (
                    devices[g].kind == req.resources.gpu_type
                    if req.resources.gpu_type
                    else devices[g].parent is None
                )
                for g in alloc.gpus
            )
        )
    if req.resources.gpu_milli_per_node:
        return (
            len(alloc.gpus) == 1
            and alloc.milli(0) == req.resources.gpu_milli_per_node
            and (
                devices[alloc.gpus[0]].kind == req.resources.gpu_type
                if req.resources.gpu_type
                else True
            )
        )
    return not alloc.gpus


def unsatisfiable(state: PlacementView, req: JobShape) -> str | None:
    """Why no state of this partition could ever run a job of this shape
    (EnforcePartLimits=ALL), or None: the user hears it at submit, not after a day in
    the queue."""
    partition = req.partition
    nodes = [n for n in state.partition_nodes(partition)]
    if req.resources.gpu_type:
        kinds = sorted({g.kind for n in nodes for g in n.spec.gpus})
        if req.resources.gpu_type not in kinds:
            listed = ", ".join(kinds) or "none"
            return (
                f"{NOT_AVAILABLE}: unknown GPU type '{req.resources.gpu_type}' "
                f"(partition {partition} has: {listed})"
            )
    if req.constraint:
        nodes = [n for n in nodes if features_match(req.constraint, node_features(n.spec))]
        if not nodes:
            return f"{NOT_AVAILABLE}: no node of partition {partition} has {req.constraint}"
    if req.nodelist:
        unknown = sorted(set(req.nodelist) - {n.name for n in nodes})
        if unknown:
            return f"{NOT_AVAILABLE}: node(s) {','.join(unknown)} not usable in {partition}"
        if len(set(req.nodelist)) > req.resources.nodes:
            return (
                f"{NOT_AVAILABLE}: {len(set(req.nodelist))} nodes listed for {req.resources.nodes}"
            )
        nodes = [n for n in nodes if n.name in req.nodelist]
    if req.exclude:
        nodes = [n for n in nodes if n.name not in req.exclude]
    want_gpus = req.resources.gpus_per_node or (1 if req.resources.gpu_milli_per_node else 0)

    def gpus(n: Node) -> int:
        return len(n.gpus_of_model(req.resources.gpu_type))

    fitting = [
        n
        for n in nodes
        if gpus(n) >= want_gpus
        and n.spec.cpus >= req.resources.cpus_per_node
        and (
            req.resources.mem_per_node_mb is None
            or n.spec.memory_mb >= req.resources.mem_per_node_mb
        )
    ]
    if len(fitting) >= req.resources.nodes:
        return None
    if not nodes:
        detail = f"partition {partition} has no nodes"
    elif want_gpus > max(gpus(n) for n in nodes):
        kind = f" {req.resources.gpu_type}" if req.resources.gpu_type else ""
        detail = (
            f"{want_gpus}{kind} GPUs per node requested, "
            f"the largest node has {max(gpus(n) for n in nodes)}"
        )
    elif req.resources.cpus_per_node > max(n.spec.cpus for n in nodes):
        most = max(n.spec.cpus for n in nodes)
        detail = (
            f"{req.resources.cpus_per_node} CPUs per node requested, the largest node has {most}"
        )
    elif req.resources.mem_per_node_mb is not None and req.resources.mem_per_node_mb > max(
        n.spec.memory_mb for n in nodes
    ):
        most_mem = max(n.spec.memory_mb for n in nodes)
        detail = (
            f"{req.resources.mem_per_node_mb}M memory per node requested, "
            f"the largest node has {most_mem}M"
        )
    else:
        detail = f"{req.resources.nodes} nodes requested, partition {partition} has {len(fitting)} "
        detail += "that fit"
    return f"{NOT_AVAILABLE}: {detail}"


def task_mix(jobs: Iterable[Job | JobShape | tuple[Job | JobShape, int]]) -> TaskMix:
    """The typical task mix of these jobs (or shapes): each per-node shape weighted
    by how many of them ask for it; an item may be a (job, count) pair standing for
    `count` jobs alike. Shapes that use no GPU carry no weight: they cannot be left
    without a GPU."""
    counts: dict[TaskShape, int] = {}
    for entry in jobs:
        item, count = entry if isinstance(entry, tuple) else (entry, 1)
        shape = TaskShape.of(item if isinstance(item, JobShape) else item.shape)
        counts[shape] = counts.get(shape, 0) + count
    return TaskMix(counts.items())


def as_mix(mix: TaskMix | Sequence[tuple[JobShape, float]]) -> TaskMix:
    """A `TaskMix` from (request, weight) pairs, or the mix itself."""
    if isinstance(mix, TaskMix):
        return mix
    return TaskMix((TaskShape.of(req), w) for req, w in mix)


def fragmentation(
    state: PlacementView, free: FreeMap, mix: TaskMix | Sequence[tuple[JobShape, float]]
) -> float:
    """GPUs left unusable by fragmentation (FGD, ATC'23): for each node and each shape
    of the typical task `mix`, weighted by popularity, the free GPU capacity that shape
    cannot use (`fragmentation.py` says how). In GPUs."""
    return fragmented_milli(free.nodes, as_mix(mix)) / MILLI


__all__ = [
    "FreeMap",
    "JobShape",
    "TaskMix",
    "allocation_fits",
    "features_match",
    "fit_on",
    "fragmentation",
    "place",
    "place_shape",
    "task_mix",
    "shape_of",
    "unsatisfiable",
]
