"""Choosing within one node: which GPUs, which share, which CPUs.

A set of GPUs is better when it spans fewer NUMA nodes, then when its links are
stronger (the sum of `LINK_WEIGHTS` over its pairs: collectives run at the speed of the
weakest path), then when it leaves fewer free GPUs in the NUMA nodes it touches, so the
untouched NUMA nodes stay whole for the next job. CPUs are bound from the GPUs' NUMA
nodes, as close to the devices as the free CPUs allow.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from math import comb

from scheduler.core.freemap import NodeFree, Shape

# Above this many subsets, grow sets greedily instead of trying them all (a node with
# 64 CPX partitions would otherwise cost millions of subsets).
EXHAUSTIVE_LIMIT = 256


def choose_gpus(shape: Shape, free: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The best `count` of the wholly free devices `free` (ascending)."""
    if count == len(free):
        return free
    return _choose(shape, free, count)


@lru_cache(maxsize=8192)
def _choose(shape: Shape, free: tuple[int, ...], count: int) -> tuple[int, ...]:
    # Pure function of the layout and the free set, so nodes built alike share answers.
    in_domain: dict[int, int] = {}
    for d in free:
        in_domain[shape.numa[d]] = in_domain.get(shape.numa[d], 0) + 1

    def score(chosen: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
        domains = {shape.numa[d] for d in chosen}
        link = sum(shape.weights[a][b] for a, b in combinations(chosen, 2))
        left = sum(in_domain[x] for x in domains) - count
        return (len(domains), -link, left, chosen)

    if comb(len(free), count) <= EXHAUSTIVE_LIMIT:
        return min(combinations(free, count), key=score)
    return min((_grow(shape, free, seed, count) for seed in free), key=score)


def _grow(shape: Shape, free: tuple[int, ...], seed: int, count: int) -> tuple[int, ...]:
    chosen = [seed]
    rest = [d for d in free if d != seed]
    while len(chosen) < count:
        best = max(
            rest,
            key=lambda d: (
                shape.numa[d] == shape.numa[seed],
                sum(shape.weights[d][c] for c in chosen),
                -d,
            ),
        )
        chosen.append(best)
        rest.remove(best)
    return tuple(sorted(chosen))


def choose_share(view: NodeFree, kind: str, milli: int, *, free: int = 0) -> int | None:
    """The device for a `milli` share: an already shared one with the smallest leftover
    that holds it, else a whole one from the NUMA node with the fewest whole ones free,
    so fractional work packs instead of breaking many GPUs. With `free`, only devices
    with exactly that much free (the fragmentation-driven choice names a free part;
    devices alike in it are then told apart by the same preferences)."""
    whole_in: dict[int, int] = {}
    for d in view.whole_free(kind):
        whole_in[view.shape.numa[d]] = whole_in.get(view.shape.numa[d], 0) + 1
    best: tuple[int, int, int] | None = None
    for d, keys in enumerate(view.shape.kinds):
        if kind not in keys:
            continue
        left = view.free_milli(d)
        if left < milli or (free and left != free):
            continue
        key = (0, left - milli, d) if view.used[d] else (1, whole_in[view.shape.numa[d]], d)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def bind_cpus(view: NodeFree, gpus: tuple[int, ...], cpus: int) -> tuple[int, ...]:
    """CPU ids for the job, from its GPUs' NUMA nodes first; () (counted, not bound)
    when too few bindable CPUs are left, as after jobs placed before binding existed."""
    ids = view.cpu_ids
    near = sorted({view.shape.numa[g] for g in gpus})
    if near and len(ids[near[0]]) >= cpus:  # the first near NUMA node holds them all
        return tuple(ids[near[0]][:cpus])
    if sum(len(d) for d in ids) < cpus:
        return ()
    if not near:
        # No GPU to be near: the NUMA node that holds the job most tightly, keeping
        # emptier ones for GPU jobs that want their CPUs.
        fitting = [d for d in range(len(ids)) if len(ids[d]) >= cpus]
        near = [min(fitting, key=lambda d: (len(ids[d]), d))] if fitting else []
    order = near + sorted(
        (d for d in range(len(ids)) if d not in near), key=lambda d: (-len(ids[d]), d)
    )
    out: list[int] = []
    for d in order:
        out.extend(ids[d][: cpus - len(out)])
        if len(out) == cpus:
            break
    return tuple(sorted(out))
