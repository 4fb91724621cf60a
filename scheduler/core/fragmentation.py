"""Fragmentation Gradient Descent's measure (Weng et al., ATC'23), computed per node
and memoised by the node's free-resource signature.

For a node n and a task shape m of the typical task mix, the fragment F_n(m) is the
free GPU capacity of n that m cannot use: all of it when m cannot run on n for any
reason (CPUs, memory, too few GPUs with its per-GPU demand free, no device of its
kind), else the free part of the physical GPUs whose free part is smaller than m's
per-GPU demand. F_n = sum over m of popularity(m) * F_n(m), in milli-GPUs. CPU-only
shapes count 0 (they cannot use GPU capacity, so none of it is lost to them).

FGD places a task on the node, and the device, whose F_n grows least. A pass makes
thousands of such choices over a thousand nodes, so:

- a node's state is a signature (free milli per device, free CPUs, free memory), and
  F depends only on the GPU part and on *which* mix shapes the CPUs and memory still
  admit, so CPUs and memory enter the memo key as ranks among the mix's demands: two
  nodes with 40 and 41 free CPUs share an entry when no shape asks for 41;
- on a node whose devices are all alike (the common case) the devices' order does not
  change F, so the GPU part is sorted and nodes built alike share entries;
- the score of (node state, request shape) is memoised as well, so scoring a node that
  was scored before in this state costs one dictionary look-up.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from scheduler.core.freemap import ANY, GpuSig, Group, NodeFree, NodeSig, gpu_sig, node_sig
from scheduler.core.nodes import MILLI

if TYPE_CHECKING:
    from scheduler.core.contract import JobShape

# Memo sizes: cleared, not evicted, when they pass this (a long-lived mix in a planner
# that runs for days must not grow without bound; rebuilding costs one pass).
MEMO_LIMIT = 500_000

# Deltas are sums of float popularities: two mathematically equal growths may differ
# in the last bits, so they are compared rounded, and the deterministic tie-break
# decides.
_DIGITS = 6


class TaskShape(NamedTuple):
    """What one task needs on one node, as the measure sees it. A tuple, so hashing
    it (once per scored node) stays in C."""

    whole: int  # whole devices
    milli: int  # or a share of one device (1..999)
    kind: str  # "" any physical GPU, a model, or a partition profile
    cpus: int
    mem_mb: int | None  # None: the node's memory per CPU; 0: all of it

    @property
    def gpus(self) -> int:
        return self.whole or (1 if self.milli else 0)

    @property
    def need(self) -> int:
        # The free part a device must have for this task to use it.
        return MILLI if self.whole else self.milli

    @classmethod
    def of(cls, shape: JobShape) -> TaskShape:
        """The per-node part of a job's shape."""
        r = shape.resources
        return cls(
            r.gpus_per_node, r.gpu_milli_per_node, r.gpu_type, r.cpus_per_node, r.mem_per_node_mb
        )


def _order(shape: TaskShape) -> tuple[int, int, str, int, int]:
    # None (memory per CPU) sorts before any explicit memory.
    return (*shape[:4], -1 if shape.mem_mb is None else shape.mem_mb)


def mem_demand(shape_mem: int | None, cpus: int, memkey: tuple[int, int]) -> int:
    """Memory a task asks of a node whose (memory per CPU, memory) is `memkey`,
    resolved as placement resolves it."""
    if shape_mem is None:
        return cpus * memkey[0]
    return shape_mem or memkey[1]


_UNSCORED: Any = object()


class TaskMix:
    """The typical tasks and their popularity (weights summing to 1 over the shapes
    that use GPUs), with the memoised measure for them."""

    def __init__(self, weighted: Iterable[tuple[TaskShape, float]]) -> None:
        merged: dict[TaskShape, float] = {}
        for shape, weight in weighted:
            if shape.gpus and weight > 0:
                merged[shape] = merged.get(shape, 0.0) + weight
        total = sum(merged.values())
        # Most popular first, then by shape: the same mix always sums in one order.
        ordered = sorted(merged.items(), key=lambda kv: (-kv[1], _order(kv[0])))
        self.shapes: tuple[TaskShape, ...] = tuple(s for s, _ in ordered)
        self.weights: tuple[float, ...] = tuple(w / total for _, w in ordered)
        self._cpu_levels = tuple(sorted({s.cpus for s in self.shapes}))
        self._cpu_rank = tuple(self._cpu_levels.index(s.cpus) for s in self.shapes)
        self._needs = tuple(sorted({s.need for s in self.shapes}))
        self._need_at = tuple(self._needs.index(s.need) for s in self.shapes)
        # Small ints for the shapes scored, so per-group memos hash an int.
        self.ids: dict[TaskShape, int] = {}
        self._mem: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._gpu: dict[GpuSig, tuple[int, tuple[int, ...]]] = {}
        self._frag: dict[tuple[GpuSig, int, tuple[int, int], int], float] = {}
        self.scores: dict[tuple[NodeSig, TaskShape], tuple[float, int] | None] = {}

    def __len__(self) -> int:
        return len(self.shapes)

    def __bool__(self) -> bool:
        return bool(self.shapes)

    def _mem_levels(self, memkey: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        # Memory demands depend on the node (memory per CPU, or all of it): one table
        # per distinct (memory per CPU, memory).
        found = self._mem.get(memkey)
        if found is None:
            demands = [mem_demand(s.mem_mb, s.cpus, memkey) for s in self.shapes]
            levels = tuple(sorted(set(demands)))
            found = (levels, tuple(levels.index(d) for d in demands))
            self._mem[memkey] = found
        return found

    def _gpu_frags(self, gpu: GpuSig) -> tuple[int, tuple[int, ...]]:
        """Free physical milli, and each shape's fragment when CPUs and memory allow it."""
        found = self._gpu.get(gpu)
        if found is not None:
            return found
        (how, keys), frees = gpu
        frags: list[int] = []
        if how == "same":
            # Sorted largest first: for each distinct per-GPU demand (ascending), the
            # devices that can serve it are a shrinking prefix.
            avail = sum(frees)
            prefix = [0]
            for f in frees:
                prefix.append(prefix[-1] + f)
            usable = len(frees)
            at_need: list[tuple[int, int]] = []
            for need in self._needs:
                while usable and frees[usable - 1] < need:
                    usable -= 1
                at_need.append((usable, avail - prefix[usable]))
            for s, n in zip(self.shapes, self._need_at, strict=True):
                count, lost = at_need[n]
                frags.append(avail if count < s.gpus or s.kind not in keys else lost)
        else:
            physical = [f for f, k in zip(frees, keys, strict=True) if ANY in k]
            avail = sum(physical)
            for s in self.shapes:
                need = s.need
                fits = zip(frees, keys, strict=True)
                count = sum(1 for f, k in fits if f >= need and s.kind in k)
                frags.append(avail if count < s.gpus else sum(f for f in physical if f < need))
        found = (avail, tuple(frags))
        if len(self._gpu) > MEMO_LIMIT:
            self._gpu.clear()
        self._gpu[gpu] = found
        return found

    def frag(self, gpu: GpuSig, cpus: int, mem: int, memkey: tuple[int, int]) -> float:
        """F of a node in this state, in milli-GPUs."""
        cpu_rank = bisect_right(self._cpu_levels, cpus)
        levels, mem_ranks = self._mem_levels(memkey)
        mem_rank = bisect_right(levels, mem)
        key = (gpu, cpu_rank, memkey, mem_rank)
        found = self._frag.get(key)
        if found is None:
            avail, frags = self._gpu_frags(gpu)
            found = 0.0
            if avail:
                for w, f, cr, mr in zip(
                    self.weights, frags, self._cpu_rank, mem_ranks, strict=True
                ):
                    found += w * (avail if cr >= cpu_rank or mr >= mem_rank else f)
            if len(self._frag) > MEMO_LIMIT:
                self._frag.clear()
            self._frag[key] = found
        return found

    def node_frag(self, view: NodeFree) -> float:
        gpu, cpus, mem, memkey = node_sig(view)
        return self.frag(gpu, cpus, mem, memkey)

    def task_id(self, task: TaskShape) -> int:
        return self.ids.setdefault(task, len(self.ids))

    def score(self, group: Group, task: TaskShape, tid: int) -> tuple[float, int] | None:
        """For a group of nodes whose devices are alike, in one state: how much F
        grows when `task` lands on one of them (rounded), and for a share the free
        part of the device to take it from; None when it does not fit. Whole devices
        are interchangeable for F, so which ones stays with `devicechoice` (links,
        NUMA)."""
        memo = group.scores
        if memo is None or memo[0] is not self:
            memo = group.scores = (self, {})
        found = memo[1].get(tid, _UNSCORED)
        if found is _UNSCORED:
            # Groups come and go as nodes change; states recur (empty nodes above all).
            key = (group.sig, task)
            found = self.scores.get(key, _UNSCORED)
            if found is _UNSCORED:
                found = self._score(group.sig, task)
                if len(self.scores) > MEMO_LIMIT:
                    self.scores.clear()
                self.scores[key] = found
            memo[1][tid] = found
        return found  # type: ignore[no-any-return]

    def _score(self, sig: NodeSig, task: TaskShape) -> tuple[float, int] | None:
        gpu, cpus, mem, memkey = sig
        (how, keys), frees = gpu
        need_mem = mem_demand(task.mem_mb, task.cpus, memkey)
        if task.cpus > cpus or need_mem > mem:
            return None
        if task.gpus and task.kind not in keys:
            return None
        before = self.frag(gpu, cpus, mem, memkey)
        cpus, mem = cpus - task.cpus, mem - need_mem
        if task.whole:
            # Sorted largest first: the wholly free devices lead.
            if len(frees) < task.whole or frees[task.whole - 1] < MILLI:
                return None
            after = frees[task.whole :] + (0,) * task.whole
            grow = self.frag(((how, keys), after), cpus, mem, memkey) - before
            return (round(grow, _DIGITS), -1)
        if task.milli:
            best: tuple[float, int] | None = None
            for at, f in enumerate(frees):
                if f < task.milli or (at and frees[at - 1] == f):
                    continue  # too small, or a free part already tried
                rest = sorted((*frees[:at], f - task.milli, *frees[at + 1 :]), reverse=True)
                grow = self.frag(((how, keys), tuple(rest)), cpus, mem, memkey) - before
                # Equal growth: the smallest leftover (pack shares, keep whole GPUs).
                option = (round(grow, _DIGITS), f)
                if best is None or option < best:
                    best = option
            return best
        grow = self.frag(gpu, cpus, mem, memkey) - before
        return (round(grow, _DIGITS), -1)


def grow_of(mix: TaskMix, view: NodeFree, after_frees: Iterable[int], cpus: int, mem: int) -> float:
    """How much F grows when the node goes from its state to the given one (for nodes
    whose devices are not alike, where the caller simulates the exact allocation)."""
    gpu, _, _, memkey = node_sig(view)
    after = mix.frag(gpu_sig(view.shape, after_frees), view.cpus - cpus, view.mem_mb - mem, memkey)
    return round(after - mix.frag(gpu, view.cpus, view.mem_mb, memkey), _DIGITS)


def fragmented_milli(nodes: Iterable[NodeFree], mix: TaskMix) -> float:
    """Sum of F over the nodes, in milli-GPUs."""
    return sum(mix.node_frag(view) for view in nodes)


__all__ = ["TaskMix", "TaskShape", "fragmented_milli", "grow_of", "node_sig"]
