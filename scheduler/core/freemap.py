"""`FreeMap`: what every up node has free during one scheduling pass, indexed.

The planner calls `place()` thousands of times per pass on a thousand nodes, so a call
must not scan them all. Two indexes keep it short:

- `whole[kind][k]`: the nodes (ordinals, ascending) with exactly k wholly free devices
  of that kind. A request for w GPUs walks k = w, w+1, ...: the first node found is the
  best fit (fewest whole GPUs left over), and whole nodes stay free for whole-node jobs.
- `partial[kind]`: (free milli, ordinal, device) of every device already shared, sorted.
  A fractional request bisects to the smallest leftover that holds it.

A kind is "" (any physical GPU), a model ("mi300x") or a partition profile ("cpx").
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from scheduler.core.jobs import NodeAlloc
from scheduler.core.nodes import MILLI, Node, related_devices
from scheduler.core.resources import LINK_WEIGHTS, NodeSpec

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState

ANY = ""
FEW_CPUS = 8  # bound CPUs moved one by one (by bisection) rather than by set arithmetic


@dataclass(frozen=True)
class Shape:
    """The static layout of a node's devices, shared by nodes built alike."""

    kinds: tuple[tuple[str, ...], ...]  # per device: the index keys it counts under
    numa: tuple[int, ...]
    weights: tuple[tuple[int, ...], ...]
    related: tuple[tuple[int, ...], ...]
    cpu_domain: tuple[int, ...]  # NUMA node of each CPU id (-1: none)

    @property
    def partitioned(self) -> bool:
        """Whether a device excludes another (a partition and its parent)."""
        found: bool | None = self.__dict__.get("_partitioned")
        if found is None:
            found = any(self.related)
            object.__setattr__(self, "_partitioned", found)
        return found

    @classmethod
    def of(cls, spec: NodeSpec) -> Shape:
        n = len(spec.gpus)
        weights = [[0] * n for _ in range(n)]
        for g in spec.gpus:
            for peer, kind in g.links:
                if 0 <= peer < n:
                    weights[g.index][peer] = LINK_WEIGHTS[kind]
        domain = [-1] * spec.cpus
        for d, cpus in enumerate(spec.numa_cpus):
            for cpu in cpus:
                domain[cpu] = d
        return cls(
            kinds=tuple((ANY, g.model) if g.parent is None else (g.profile,) for g in spec.gpus),
            numa=tuple(g.numa for g in spec.gpus),
            weights=tuple(tuple(row) for row in weights),
            related=related_devices(spec),
            cpu_domain=tuple(domain),
        )

    def __hash__(self) -> int:
        # Hashed on every memoised device choice: compute once.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.kinds, self.numa, self.weights, self.related, self.cpu_domain))
            object.__setattr__(self, "_hash", cached)
        return cached


@lru_cache(maxsize=1024)
def _cpu_sets(shape: Shape) -> tuple[frozenset[int], ...]:
    """The CPU ids of each NUMA node of the layout."""
    sets: list[set[int]] = [set() for _ in range(max(shape.cpu_domain, default=-1) + 1)]
    for cpu, d in enumerate(shape.cpu_domain):
        if d >= 0:
            sets[d].add(cpu)
    return tuple(frozenset(s) for s in sets)


@lru_cache(maxsize=4096)
def _distinct(shape: Shape, gpus: tuple[int, ...]) -> bool:
    """Whether these devices may be held together: each of the layout's, none twice,
    and none related to another (a partition and its parent)."""
    chosen = set(gpus)
    return len(chosen) == len(gpus) and all(
        0 <= d < len(shape.kinds) and not chosen.intersection(shape.related[d]) for d in gpus
    )


@lru_cache(maxsize=1024)
def _intern(shape: Shape) -> Shape:
    """One object per distinct layout: nodes built alike then share memoised choices
    by identity instead of comparing layouts."""
    return shape


# A node's free-resource signature, what fragmentation depends on. Its GPU part is
# (layout, free milli): the layout is ("same", keys) when every device counts under
# the same index keys (their order then does not matter, so the free parts are sorted,
# largest first, and nodes built alike in the same state share one signature), else
# ("each", keys per device). Then free CPUs, free memory, (memory per CPU, memory).
GpuSig = tuple[tuple[str, Any], tuple[int, ...]]
NodeSig = tuple[GpuSig, int, int, tuple[int, int]]


@lru_cache(maxsize=1024)
def _layout(shape: Shape) -> tuple[str, Any]:
    kinds = shape.kinds
    if kinds and all(k == kinds[0] for k in kinds) and ANY in kinds[0]:
        return ("same", kinds[0])
    return ("each", kinds)


def alike(view: NodeFree) -> bool:
    """Whether the node's devices are interchangeable: one kind, no partitions."""
    return view.same


def gpu_sig(shape: Shape, frees: Iterable[int]) -> GpuSig:
    layout = _layout(shape)
    if layout[0] == "same":
        return (layout, tuple(sorted(frees, reverse=True)))
    return (layout, tuple(frees))


def node_sig(view: NodeFree) -> NodeSig:
    """The node's free-resource signature, kept on the view until it changes."""
    sig: NodeSig | None = view.sig
    if sig is None:
        gpus = devices(view.shape, tuple(view.used), tuple(view.blocked))[2]
        sig = (gpus, view.cpus, view.mem_mb, view.memkey)
        view.sig = sig
    return sig


# What the indexes keep of a node's devices in one state: free whole devices per index
# key, (key, free milli, device) of each shared device with room left, and the GPU part
# of its signature. A pure function of (layout, milli used, blocked), memoised: nodes
# of one layout pass through few states, and a shadow of the future re-indexes
# hundreds of nodes per probe.
Devices = tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int, int], ...], GpuSig]
_DEVICES: dict[tuple[Shape, tuple[int, ...], tuple[int, ...]], Devices] = {}
_DEVICES_MAX = 1 << 16


def devices(shape: Shape, used: tuple[int, ...], blocked: tuple[int, ...]) -> Devices:
    key = (shape, used, blocked)
    found = _DEVICES.get(key)
    if found is None:
        counts: dict[str, int] = {ANY: 0}
        partials: list[tuple[str, int, int]] = []
        frees: list[int] = []
        for d, keys in enumerate(shape.kinds):
            free = 0 if blocked[d] else MILLI - used[d]
            frees.append(free)
            if free == MILLI:
                for k in keys:
                    counts[k] = counts.get(k, 0) + 1
            else:
                for k in keys:
                    counts.setdefault(k, 0)
                if used[d] and free:
                    partials.extend((k, free, d) for k in keys)
        found = (tuple(counts.items()), tuple(partials), gpu_sig(shape, frees))
        if len(_DEVICES) >= _DEVICES_MAX:
            _DEVICES.clear()
        _DEVICES[key] = found
    return found


class Group:
    """Nodes with interchangeable devices in the same state (one signature): scoring
    one of them scores them all."""

    __slots__ = ("members", "scores", "sig")

    def __init__(self, sig: NodeSig) -> None:
        self.sig = sig
        self.members: list[int] = []  # ordinals, ascending
        # (task mix, {task shape: score}): a pure function of the signature, so
        # copies of the free map share it.
        self.scores: Any = None

    def copy(self) -> Group:
        out = Group(self.sig)
        out.members, out.scores = list(self.members), self.scores
        return out


class NodeFree:
    """One node's free resources; mutated only through its `FreeMap`."""

    __slots__ = (
        "allocs",
        "blocked",
        "cpu_ids",
        "cpus",
        "cpus_shared",
        "indexed",
        "mem_mb",
        "memkey",
        "name",
        "ordinal",
        "same",
        "shape",
        "sig",
        "spec",
        "used",
    )

    def __init__(self, ordinal: int, spec: NodeSpec, shape: Shape) -> None:
        self.ordinal = ordinal
        self.name = spec.name
        self.spec = spec
        self.shape = shape
        self.used = [0] * len(spec.gpus)  # milli held per device
        self.blocked = [0] * len(spec.gpus)  # related devices holding a share
        self.cpus = spec.cpus
        self.mem_mb = spec.memory_mb
        self.cpu_ids = [list(d) for d in spec.numa_cpus]  # free, bindable, per NUMA node
        self.cpus_shared = False
        self.allocs = 0
        self.same = _layout(shape)[0] == "same"  # devices interchangeable (`alike`)
        self.memkey = (spec.memory_mb // spec.cpus if spec.cpus else 0, spec.memory_mb)
        # What the map's indexes hold of it: (counts, partials, group signature).
        self.indexed: tuple[Any, Any, Any] = ((), (), None)
        # The free-resource signature (fragmentation.node_sig), None until asked for
        # and whenever the node changes.
        self.sig: Any = None

    def copy(self) -> NodeFree:
        out = NodeFree.__new__(NodeFree)
        out.ordinal, out.name, out.spec, out.shape = self.ordinal, self.name, self.spec, self.shape
        out.same, out.memkey = self.same, self.memkey
        out.used, out.blocked = list(self.used), list(self.blocked)
        out.cpus, out.mem_mb, out.allocs = self.cpus, self.mem_mb, self.allocs
        # The CPU lists are shared until one side binds or frees a CPU (`own_cpus`):
        # a shadow's copy of a node mostly changes its devices alone.
        out.cpu_ids = self.cpu_ids
        out.cpus_shared = self.cpus_shared = True
        out.indexed = self.indexed
        out.sig = self.sig
        return out

    def own_cpus(self) -> list[list[int]]:
        """The free CPU lists, this view's own to change: a list is replaced whole,
        never changed in place, so the views that share it keep theirs."""
        if self.cpus_shared:
            self.cpu_ids = list(self.cpu_ids)
            self.cpus_shared = False
        return self.cpu_ids

    def free_milli(self, device: int) -> int:
        return 0 if self.blocked[device] else MILLI - self.used[device]

    def whole_free(self, kind: str) -> list[int]:
        return [
            d
            for d, keys in enumerate(self.shape.kinds)
            if kind in keys and not self.used[d] and not self.blocked[d]
        ]


class FreeMap:
    """Free resources of every up node, for one pass; `take`/`give` keep it current."""

    def __init__(self) -> None:
        self.nodes: list[NodeFree] = []
        self.by_name: dict[str, int] = {}
        self._whole: dict[str, list[list[int]]] = {}
        self._partial: dict[str, list[tuple[int, int, int]]] = {}
        # Nodes whose devices are alike, by signature; the others are in `unalike`.
        self._groups: dict[NodeSig, Group] = {}
        # Nodes changed since they were last indexed (out of the indexes until then):
        # a node is indexed again once, when the indexes are next read, however many
        # takes and gives changed it meanwhile (backfill gives back hundreds of jobs
        # between two probes of the future, a few per node).
        self._stale: dict[int, None] = {}
        self.unalike: list[int] = []
        # What stays fixed for the pass (which ordinals a (partition, constraint,
        # nodelist, exclude) may use, the parsed topology), so copies share it.
        self.statics: dict[tuple[Any, ...], Any] = {}
        # Copy on write: after copy(), the two maps share their node views and each
        # copies a view the first time it changes it. None: every view is this map's.
        # Backfill takes a copy per probe of the future; most nodes never change in it.
        self._owned: set[int] | None = None

    @classmethod
    def of(cls, state: ClusterState) -> FreeMap:
        free = cls()
        for _, node in sorted(state.nodes.items()):
            if not node.takes_jobs:
                continue
            view = NodeFree(len(free.nodes), node.spec, shape_of(node))
            _load(view, node)
            free._add(view)
        return free

    @classmethod
    def of_specs(cls, specs: Sequence[NodeSpec]) -> FreeMap:
        """An empty cluster of these nodes (for benchmarks and tests)."""
        free = cls()
        for spec in sorted(specs, key=lambda s: s.name):
            view = NodeFree(len(free.nodes), spec, _intern(Shape.of(spec)))
            free._add(view)
        return free

    # The indexes, current: what `place` reads.
    @property
    def whole(self) -> dict[str, list[list[int]]]:
        if self._stale:
            self._settle()
        return self._whole

    @property
    def partial(self) -> dict[str, list[tuple[int, int, int]]]:
        if self._stale:
            self._settle()
        return self._partial

    @property
    def groups(self) -> dict[NodeSig, Group]:
        if self._stale:
            self._settle()
        return self._groups

    def _settle(self) -> None:
        for o in self._stale:
            self._index(self.nodes[o])
        self._stale.clear()

    def _add(self, view: NodeFree) -> None:
        self.by_name[view.name] = view.ordinal
        self.nodes.append(view)
        if not alike(view):
            self.unalike.append(view.ordinal)
        self._index(view)

    def copy(self) -> FreeMap:
        if self._stale:
            self._settle()
        out = FreeMap()
        out.nodes = list(self.nodes)
        self._owned = set()
        out._owned = set()
        out.by_name = self.by_name
        out._whole = {k: [list(b) for b in buckets] for k, buckets in self._whole.items()}
        out._partial = {k: list(v) for k, v in self._partial.items()}
        out._groups = {sig: g.copy() for sig, g in self._groups.items()}
        out.unalike = self.unalike
        out.statics = self.statics
        return out

    def node(self, name: str) -> NodeFree | None:
        ordinal = self.by_name.get(name)
        return None if ordinal is None else self.nodes[ordinal]

    def can_take(self, allocs: Sequence[tuple[str, NodeAlloc]]) -> bool:
        """Whether every allocation still fits: milli shares, partitions apart from
        their parents, CPUs (bound ones free), memory."""
        for name, alloc in allocs:
            view = self.node(name)
            if view is None or alloc.cpus > view.cpus or alloc.mem_mb > view.mem_mb:
                return False
            gpus = alloc.gpus
            if gpus:
                if not _distinct(view.shape, gpus):
                    return False
                used, blocked, milli = view.used, view.blocked, alloc.gpu_milli
                if milli:
                    for i, d in enumerate(gpus):
                        if blocked[d] or not 0 < milli[i] <= MILLI - used[d]:
                            return False
                elif any(used[d] or blocked[d] for d in gpus):
                    return False
            cpus = alloc.cpu_ids
            if len(cpus) > FEW_CPUS:
                # Each free CPU is in its own NUMA node's list: free is in any list.
                if not set().union(*view.cpu_ids).issuperset(cpus):
                    return False
            elif cpus:
                domain = view.shape.cpu_domain
                for cpu in cpus:
                    if not 0 <= cpu < len(domain) or domain[cpu] < 0:
                        return False
                    ids = view.cpu_ids[domain[cpu]]
                    at = bisect_left(ids, cpu)
                    if at == len(ids) or ids[at] != cpu:
                        return False
        return True

    def take(self, allocs: Sequence[tuple[str, NodeAlloc]]) -> None:
        """Hold `allocs`; ValueError (and nothing changed) when they do not fit."""
        if not self.can_take(allocs):
            raise ValueError(f"allocation does not fit: {allocs!r}")
        self._apply(allocs, +1)

    def take_fitting(self, allocs: Sequence[tuple[str, NodeAlloc]]) -> None:
        """`take` what is known to fit (placed on this map, or just checked with
        `can_take`): the check is most of what a take costs."""
        self._apply(allocs, +1)

    def give(self, allocs: Sequence[tuple[str, NodeAlloc]]) -> None:
        """What-if: a job ends and its resources come back."""
        self._apply(allocs, -1)

    def _apply(self, allocs: Sequence[tuple[str, NodeAlloc]], sign: int) -> None:
        stale = self._stale
        for name, alloc in allocs:
            o = self.by_name.get(name)
            if o is None:
                continue  # a node that went down: nothing of it is offered anyway
            view = self._writable(self.nodes[o])
            if o not in stale:
                self._unindex(view)  # as it was indexed: unchanged since
                stale[o] = None
            view.sig = None
            used, milli = view.used, alloc.gpu_milli
            related = view.shape.related
            if milli or view.shape.partitioned:
                for i, d in enumerate(alloc.gpus):
                    before = used[d]
                    after = used[d] = before + sign * (milli[i] if milli else MILLI)
                    if (before == 0) != (after == 0):
                        for r in related[d]:
                            view.blocked[r] += sign
            else:  # whole devices, none related to another: nothing to block
                step = sign * MILLI
                for d in alloc.gpus:
                    used[d] += step
            view.cpus -= sign * alloc.cpus
            view.mem_mb -= sign * alloc.mem_mb
            view.allocs += sign
            if alloc.cpu_ids:
                # Bound CPUs, a NUMA node's list at a time: a new list (see `own_cpus`)
                # less those taken or with those given, by bisection when they are few
                # (most jobs bind a CPU or a few), none when they are the node's all.
                cpu_ids = view.own_cpus()
                bound = set(alloc.cpu_ids)
                for numa, members in enumerate(_cpu_sets(view.shape)):
                    if members.isdisjoint(bound):
                        continue
                    mine, ids = members & bound, cpu_ids[numa]
                    if sign > 0 and len(mine) == len(members):
                        cpu_ids[numa] = []
                    elif len(mine) <= FEW_CPUS:
                        ids = list(ids)
                        for cpu in sorted(mine):
                            if sign > 0:
                                del ids[bisect_left(ids, cpu)]
                            else:
                                insort(ids, cpu)
                        cpu_ids[numa] = ids
                    else:
                        cpu_ids[numa] = sorted(set(ids) - mine if sign > 0 else set(ids) | mine)

    def _writable(self, view: NodeFree) -> NodeFree:
        if self._owned is None or view.ordinal in self._owned:
            return view
        mine = view.copy()
        self.nodes[view.ordinal] = mine
        self._owned.add(view.ordinal)
        return mine

    def _index(self, view: NodeFree) -> None:
        counts, partials, gpus = devices(view.shape, tuple(view.used), tuple(view.blocked))
        o = view.ordinal
        whole = self._whole
        for kind, count in counts:
            buckets = whole.get(kind)
            if buckets is None:
                buckets = whole[kind] = []
            while len(buckets) <= count:
                buckets.append([])
            insort(buckets[count], o)
        for kind, free, d in partials:
            insort(self._partial.setdefault(kind, []), (free, o, d))
        sig = None
        if view.same:
            sig = view.sig
            if sig is None:
                sig = view.sig = (gpus, view.cpus, view.mem_mb, view.memkey)
            group = self._groups.get(sig)
            if group is None:
                group = self._groups[sig] = Group(sig)
            insort(group.members, o)
        view.indexed = (counts, partials, sig)

    def _unindex(self, view: NodeFree) -> None:
        counts, partials, sig = view.indexed
        o = view.ordinal
        for kind, count in counts:
            bucket = self._whole[kind][count]
            del bucket[bisect_left(bucket, o)]
        for kind, free, d in partials:
            entries = self._partial[kind]
            del entries[bisect_left(entries, (free, o, d))]
        if sig is not None:
            group = self._groups[sig]
            del group.members[bisect_left(group.members, o)]
            if not group.members:
                del self._groups[sig]


def shape_of(node: Node) -> Shape:
    # Built once per node and spec; the layout never changes while the spec stays.
    cached: tuple[NodeSpec, Shape] | None = getattr(node, "_shape", None)
    if cached is None or cached[0] is not node.spec:
        cached = (node.spec, _intern(Shape.of(node.spec)))
        node._shape = cached  # type: ignore[attr-defined]
    return cached[1]


def _load(view: NodeFree, node: Node) -> None:
    """Start from what the node's jobs hold now."""
    for d, shares in enumerate(node.gpu_shares):
        used = sum(shares.values())
        view.used[d] = used
        if used:
            for r in view.shape.related[d]:
                view.blocked[r] += 1
    view.cpus = node.cpus_free
    view.mem_mb = node.mem_free_mb
    view.allocs = len(node.jobs)
    owned = node.cpu_owner
    if owned:
        view.cpu_ids = [
            list(d) if owned.keys().isdisjoint(d) else [c for c in d if c not in owned]
            for d in node.spec.numa_cpus
        ]
