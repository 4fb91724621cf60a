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
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from scheduler.core.freemap import ANY, NodeFree, Shape
from scheduler.core.nodes import MILLI

# Memo sizes: cleared, not evicted, when they pass this (a long-lived mix in a planner
# that runs for days must not grow without bound; rebuilding costs one pass).
MEMO_LIMIT = 500_000

# Deltas are sums of float popularities: two mathematically equal growths may differ
# in the last bits, so they are compared rounded, and the deterministic tie-break
# decides.
_DIGITS = 6


@dataclass(frozen=True, order=True)
class TaskShape:
    """What one task needs on one node, as the measure sees it."""

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
    def of(cls, req: Any) -> TaskShape:
        """From a placement `Request` (or anything with its fields)."""
        return cls(int(req.whole), int(req.milli), str(req.kind), int(req.cpus), req.mem_mb)


def mem_demand(shape_mem: int | None, cpus: int, memkey: tuple[int, int]) -> int:
    """Memory a task asks of a node whose (memory per CPU, memory) is `memkey`,
    resolved as placement resolves it."""
    if shape_mem is None:
        return cpus * memkey[0]
    return shape_mem or memkey[1]


# The GPU part of a signature: (layout, free milli). The layout is ("same", keys) when
# every device counts under the same index keys (their order then does not matter and
# the free parts are sorted, largest first), else ("each", keys per device).
GpuSig = tuple[tuple[str, Any], tuple[int, ...]]
# A node's full state: GPU part, free CPUs, free memory, (memory per CPU, memory).
NodeSig = tuple[GpuSig, int, int, tuple[int, int]]


@lru_cache(maxsize=1024)
def _layout(shape: Shape) -> tuple[str, Any]:
    kinds = shape.kinds
    if kinds and all(k == kinds[0] for k in kinds) and ANY in kinds[0]:
        return ("same", kinds[0])
    return ("each", kinds)


def alike(view: NodeFree) -> bool:
    """Whether the node's devices are interchangeable for the measure."""
    return _layout(view.shape)[0] == "same"


def gpu_sig(shape: Shape, frees: Iterable[int]) -> GpuSig:
    layout = _layout(shape)
    if layout[0] == "same":
        return (layout, tuple(sorted(frees, reverse=True)))
    return (layout, tuple(frees))


def node_sig(view: NodeFree) -> NodeSig:
    """The node's free-resource signature, kept on the view until it changes."""
    sig: NodeSig | None = view.sig
    if sig is None:
        frees = [view.free_milli(d) for d in range(len(view.used))]
        spec = view.spec
        memkey = (spec.memory_mb // spec.cpus if spec.cpus else 0, spec.memory_mb)
        sig = (gpu_sig(view.shape, frees), view.cpus, view.mem_mb, memkey)
        view.sig = sig
    return sig


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
        ordered = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))
        self.shapes: tuple[TaskShape, ...] = tuple(s for s, _ in ordered)
        self.weights: tuple[float, ...] = tuple(w / total for _, w in ordered)
        self._cpu_levels = tuple(sorted({s.cpus for s in self.shapes}))
        self._cpu_rank = tuple(self._cpu_levels.index(s.cpus) for s in self.shapes)
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
        if how == "same":
            per_device: tuple[tuple[str, ...], ...] = (keys,) * len(frees)
        else:
            per_device = keys
        physical = [f for f, k in zip(frees, per_device, strict=True) if ANY in k]
        avail = sum(physical)
        frags = []
        for s in self.shapes:
            need = s.need
            usable = sum(
                1 for f, k in zip(frees, per_device, strict=True) if f >= need and s.kind in k
            )
            if usable < s.gpus:
                frags.append(avail)
            else:
                frags.append(sum(f for f in physical if f < need))
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

    def score(self, view: NodeFree, task: TaskShape) -> tuple[float, int] | None:
        """For a node whose devices are alike: how much F grows when `task` lands on it
        (rounded), and for a share the free part of the device to take it from; None
        when it does not fit. Whole devices are interchangeable for F, so the device
        choice within the node stays with `devicechoice` (links, NUMA)."""
        sig = node_sig(view)
        key = (sig, task)
        if key in self.scores:
            return self.scores[key]
        found = self._score(sig, task)
        if len(self.scores) > MEMO_LIMIT:
            self.scores.clear()
        self.scores[key] = found
        return found

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


__all__ = ["TaskMix", "TaskShape", "alike", "fragmented_milli", "grow_of", "node_sig"]
