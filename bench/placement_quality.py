"""Placement quality on the Alibaba GPU cluster trace (openb, FGD / ATC'23).

Replays `openb_pod_list_default.csv` on the 1,213 nodes of `openb_node_list_gpu_node.csv`
(read in place from ../shared/reference/traces/alibaba-gpu-v2023/, never copied) with
three policies: ours (`scheduler.core.placement.place`), first fit (the lowest node that
fits, its lowest free GPU indices) and random (a seeded random node among those that
fit, random free GPUs). Two replays per policy, in pure Python (`--timing` instead
times place() at 1,024 nodes):

1. Arrive until full (the FGD paper's method): pods arrive in creation order and never
   leave; a pod that does not fit is dropped. The trace asks for ~98% of the cluster's
   GPUs, so the cluster ends full. Measured at the end: the share of GPU capacity
   allocated, and the GPUs left unusable by fragmentation.
   Fragmented GPUs are measured when the arrived GPU demand reaches 50, 60, 70, 80 and
   90% of capacity (the points of FGD's curves) and averaged; at 100% every policy
   has only scraps left and they all look alike.
2. Timed (how scheduling papers load a cluster from a trace): the trace itself never
   loads the cluster (its pods mostly run minutes across 149 days: 0.23% of the GPUs
   allocated on average), so its arrivals are compressed. Each pod keeps its order and
   its runtime (`deletion_time - scheduled_time`; `creation_time` when never
   scheduled); inter-arrival gaps longer than the trace's 99th-percentile gap (the idle
   weeks at its start) are clipped to it, then all are divided by the factor k that
   makes the offered GPU load, sum(demand x runtime cut at the window's end) over
   (capacity x window), equal LOAD (1.0) x capacity over the arrival window
   (`compression`). Even all at once the trace asks for only ~98% of the full
   cluster's GPUs, so this replay runs on every STRIDE-th (8th) node of the node list
   (152 nodes, 770 GPUs; the same node mix), which also keeps it fast. A pod that does
   not fit waits in a FIFO queue and starts, placed by the same policy, when it fits;
   two disciplines: with backfill (whenever resources free, queued pods are tried in
   arrival order and every one that fits starts, as `plan()` lets later jobs pass a
   blocked one) and strict FIFO (only the queue's head may start; the others wait
   behind it). The replay runs until every pod has started. Measured: wait = start -
   (compressed) arrival, its mean and p95 over all pods; over the arrival window, the
   time-averaged share of GPU capacity allocated and the fragmented GPUs (sampled
   FRAG_SAMPLES times, evenly).

Fragmentation (FGD's definition): for a node n and a task shape m of the typical mix
(every pod shape of the trace, weighted by how often it occurs), the free GPU capacity
of n that m cannot use: all of it when m does not fit on n at all (too few CPUs, memory,
whole GPUs, or no GPU with m's share free), otherwise the free milli on GPUs whose free
part is smaller than m's per-GPU demand; 0 for CPU-only shapes. Fragmented GPUs =
sum over nodes of the mix-weighted expectation, in GPUs.

CPUs are counted in tenths (the trace's cpu_milli / 100), because most pods ask for a
fraction of a CPU and rounding them up to whole CPUs would invent CPU shortage.
"""

from __future__ import annotations

import csv
import heapq
import json
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core import commands as c  # noqa: E402
from scheduler.core.contract import JobSpec  # noqa: E402
from scheduler.core.freemap import FreeMap, NodeFree  # noqa: E402
from scheduler.core.jobs import Job, NodeAlloc  # noqa: E402
from scheduler.core.placement import TaskMix, fragmentation, place, task_mix  # noqa: E402
from scheduler.core.resources import GpuDevice, NodeSpec  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "shared/reference/traces/alibaba-gpu-v2023"
CPU_UNIT = 100  # milli-CPUs per counted CPU
SEED = 20230710
# The timed replay: every STRIDE-th node, arrivals compressed to offer LOAD x capacity.
STRIDE = 8
LOAD = 1.0
GAP_QUANTILE = 0.99  # inter-arrival gaps longer than this quantile are clipped to it
FRAG_SAMPLES = 50  # fragmentation sampled this many times, evenly over the window

Allocs = tuple[tuple[str, NodeAlloc], ...]
Policy = Callable[[Job, FreeMap], Allocs | None]


@dataclass(frozen=True)
class Pod:
    job: Job
    arrive: float
    runtime: float
    gpu_milli: int  # total GPU milli asked


def load(stride: int = 1) -> tuple[ClusterState, list[Pod]]:
    """The cluster (every `stride`-th node of the node list) and the pods, in creation
    order."""
    state = ClusterState()
    state.apply(c.ConfigurePartitions("p", 0.0, (c.PartitionDef(name="all", default=True),)))
    with (TRACE / "openb_node_list_gpu_node.csv").open() as f:
        for row in list(csv.DictReader(f))[::stride]:
            model = row["model"].lower()
            gpus = tuple(
                GpuDevice(index=i, vendor="trace", model=model, memory_mb=1)
                for i in range(int(row["gpu"]))
            )
            node = NodeSpec(
                name=row["sn"],
                cpus=int(row["cpu_milli"]) // CPU_UNIT,
                memory_mb=int(row["memory_mib"]),
                agent_url="trace://",
                gpus=gpus,
            )
            state.apply(c.RegisterNode("r", 0.0, node))
    pods = []
    with (TRACE / "openb_pod_list_default.csv").open() as f:
        for i, row in enumerate(csv.DictReader(f), start=1):
            num_gpu, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            share = num_gpu == 1 and 0 < milli < 1000
            spec = JobSpec(
                script="#!/bin/sh\n",
                partition="all",
                cpus_per_task=max(1, -(-int(row["cpu_milli"]) // CPU_UNIT)),
                mem_per_node_mb=max(1, int(row["memory_mib"])),
                gpus_per_node=0 if share else num_gpu,
                gpu_milli=milli if share else 0,
            )
            job = Job(
                job_id=i,
                spec=spec,
                partition="all",
                account="trace",
                time_limit_min=None,
                submit_time=0.0,
            )
            created = float(row["creation_time"])
            started = float(row["scheduled_time"] or created)
            runtime = max(0.0, float(row["deletion_time"]) - started)
            pods.append(Pod(job, created, runtime, milli if share else 1000 * num_gpu))
    pods.sort(key=lambda p: (p.arrive, p.job.job_id))
    return state, pods


# -- the baselines ---------------------------------------------------------------------


def _simple(
    view: NodeFree, job: Job, pick: Callable[[list[int], int], list[int]]
) -> NodeAlloc | None:
    spec = job.spec
    cpus, mem = job.shape.resources.cpus_per_node, spec.mem_per_node_mb or 1
    if cpus > view.cpus or mem > view.mem_mb:
        return None
    if spec.gpu_milli:
        fits = [d for d in range(len(view.used)) if view.free_milli(d) >= spec.gpu_milli]
        if not fits:
            return None
        return NodeAlloc(
            gpus=tuple(pick(fits, 1)), cpus=cpus, mem_mb=mem, gpu_milli=(spec.gpu_milli,)
        )
    whole = [d for d in range(len(view.used)) if view.free_milli(d) == 1000]
    if len(whole) < spec.gpus_per_node:
        return None
    gpus = tuple(sorted(pick(whole, spec.gpus_per_node))) if spec.gpus_per_node else ()
    return NodeAlloc(gpus=gpus, cpus=cpus, mem_mb=mem)


def _lowest(devices: list[int], n: int) -> list[int]:
    return devices[:n]


def first_fit(job: Job, free: FreeMap) -> Allocs | None:
    for view in free.nodes:
        alloc = _simple(view, job, lambda ds, n: ds[:n])
        if alloc is not None:
            return ((view.name, alloc),)
    return None


def random_fit(rng: random.Random) -> Policy:
    def policy(job: Job, free: FreeMap) -> Allocs | None:
        fitting = [v for v in free.nodes if _simple(v, job, lambda ds, n: ds[:n]) is not None]
        if not fitting:
            return None
        view = rng.choice(fitting)
        alloc = _simple(view, job, lambda ds, n: rng.sample(ds, n))
        assert alloc is not None
        return ((view.name, alloc),)

    return policy


# -- the replays -------------------------------------------------------------------------


CHECKPOINTS = (0.5, 0.6, 0.7, 0.8, 0.9)  # arrived GPU demand, as a share of capacity


def arrive_until_full(
    state: ClusterState, pods: list[Pod], policy: Policy, mix: TaskMix
) -> dict[str, float]:
    free = FreeMap.of(state)
    capacity = sum(len(v.used) for v in free.nodes) * 1000
    allocated = placed = arrived = 0
    frags: list[float] = []
    marks = list(CHECKPOINTS)
    for pod in pods:
        arrived += pod.gpu_milli
        allocs = policy(pod.job, free)
        if allocs is not None:
            free.take(allocs)
            placed += 1
            allocated += pod.gpu_milli
        while marks and arrived >= marks[0] * capacity:
            marks.pop(0)
            frags.append(fragmentation(state, free, mix))
    return {
        "allocated_share": round(allocated / capacity, 4),
        "fragmented_gpus": round(sum(frags) / len(frags), 1),
        **{
            f"frag_at_{int(m * 100)}": round(f, 1) for m, f in zip(CHECKPOINTS, frags, strict=False)
        },
        "pods_placed": placed,
    }


# -- the timed replay's arrivals (pure) ----------------------------------------------------


def clip_gaps(times: Sequence[float], q: float = GAP_QUANTILE) -> list[float]:
    """Arrival times (sorted) with every inter-arrival gap longer than the q-quantile
    gap clipped to it, starting at 0: the trace's idle weeks go, its order and the
    shape of its busy periods stay."""
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    if not gaps:
        return [0.0] * len(times)
    cap = percentile(sorted(gaps), q)
    out = [0.0]
    for gap in gaps:
        out.append(out[-1] + min(gap, cap))
    return out


def offered_load(
    arrive: Sequence[float], runtime: Sequence[float], demand: Sequence[int], capacity: int
) -> float:
    """GPU demand offered over the arrival window [first, last arrival], as a share of
    `capacity` (same unit as `demand`): each pod counts its demand for its runtime,
    cut at the window's end."""
    if not arrive:
        return 0.0
    first, last = arrive[0], arrive[-1]
    if last <= first:
        return (
            float("inf")
            if any(r > 0 and d > 0 for r, d in zip(runtime, demand, strict=True))
            else 0.0
        )
    work = sum(d * min(r, last - a) for a, r, d in zip(arrive, runtime, demand, strict=True))
    return work / (capacity * (last - first))


def compression(
    arrive: Sequence[float],
    runtime: Sequence[float],
    demand: Sequence[int],
    capacity: int,
    target: float,
) -> float:
    """The factor k such that arrivals at a/k (runtimes kept) offer `target` times
    `capacity` over the arrival window (bisection on log k; the offered load only
    grows with k)."""
    lo, hi = 1e-6, 1e12

    def at(k: float) -> float:
        return offered_load([a / k for a in arrive], runtime, demand, capacity)

    if at(hi) < target:
        return hi
    for _ in range(80):
        mid = (lo * hi) ** 0.5
        if at(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0001:
            break
    return hi


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted `values` (nearest rank below); 0 when empty."""
    return values[int(q * (len(values) - 1))] if values else 0.0


# -- the timed replay ------------------------------------------------------------------------


def shape_of(pod: Pod) -> tuple[int, int, int, int]:
    spec = pod.job.spec
    return (
        pod.job.shape.resources.cpus_per_node,
        spec.mem_per_node_mb or 1,
        spec.gpus_per_node,
        spec.gpu_milli,
    )


def timed(
    state: ClusterState,
    pods: Sequence[Pod],
    arrive: Sequence[float],
    policy: Policy,
    mix: TaskMix,
    samples: int = FRAG_SAMPLES,
    backfill: bool = True,
) -> dict[str, float]:
    """Pods arrive at `arrive` (sorted) and run for their runtime; those that do not
    fit queue. With `backfill`, whenever resources free, queued pods are tried in
    arrival order and every one that fits starts (a blocked pod does not hold back
    later ones); without, only the queue's head may start (strict FIFO). Runs until
    every pod has started."""
    free = FreeMap.of(state)
    views = {v.name: v for v in free.nodes}
    capacity = sum(len(v.used) for v in free.nodes) * 1000
    first, last = arrive[0], arrive[-1]
    step = (last - first) / max(samples, 1)
    ends: list[tuple[float, int, Allocs, int]] = []
    queue: dict[tuple[int, int, int, int], deque[tuple[int, Pod]]] = {}
    waits: list[float] = []
    frags: list[float] = []
    used = 0
    area = 0.0  # GPU milli-seconds allocated inside the arrival window
    clock = first
    next_sample = first

    def advance(to: float) -> None:
        nonlocal area, clock, next_sample
        while next_sample <= min(to, last) and len(frags) < samples:
            frags.append(fragmentation(state, free, mix))
            next_sample += step
        area += used * (max(first, min(to, last)) - max(first, min(clock, last)))
        clock = to

    def start(pod: Pod, at: float, now: float) -> bool:
        nonlocal used
        allocs = policy(pod.job, free)
        if allocs is None:
            return False
        free.take(allocs)
        used += pod.gpu_milli
        waits.append(now - at)
        heapq.heappush(ends, (now + pod.runtime, pod.job.job_id, allocs, pod.gpu_milli))
        return True

    def drain(now: float, released: set[str]) -> None:
        # Only the released nodes changed since every queued pod last failed, so only
        # they can host one: a shape is tried only if it fits there (cheap check).
        near = [views[n] for n in released]
        heads = [(q[0][0], shape) for shape, q in queue.items()]
        heapq.heapify(heads)
        while heads:
            _, shape = heapq.heappop(heads)
            q = queue[shape]
            seq, pod = q[0]
            if not any(_simple(v, pod.job, _lowest) for v in near) or not start(
                pod, arrive[seq], now
            ):
                if backfill:
                    continue
                break
            q.popleft()
            if q:
                heapq.heappush(heads, (q[0][0], shape))
            else:
                del queue[shape]

    def release(until: float) -> None:
        nonlocal used
        while ends and ends[0][0] <= until:
            now = ends[0][0]
            released: set[str] = set()
            advance(now)
            while ends and ends[0][0] == now:
                _, _, allocs, milli = heapq.heappop(ends)
                free.give(allocs)
                used -= milli
                released.update(name for name, _ in allocs)
            if queue:
                drain(now, released)

    for seq, pod in enumerate(pods):
        release(arrive[seq])
        advance(arrive[seq])
        shape = shape_of(pod)
        blocked = shape in queue if backfill else bool(queue)
        if blocked or not start(pod, arrive[seq], arrive[seq]):
            queue.setdefault(shape, deque()).append((seq, pod))
    while queue:
        release(ends[0][0])
    waits.sort()
    return {
        "time_avg_allocated_share": round(area / (last - first) / capacity, 4)
        if last > first
        else 0.0,
        "time_avg_fragmented_gpus": round(sum(frags) / len(frags), 1) if frags else 0.0,
        "mean_wait_s": round(sum(waits) / len(waits), 1),
        "p95_wait_s": round(percentile(waits, 0.95), 1),
        "max_wait_s": round(waits[-1], 1),
    }


def timing(nodes: int = 1024) -> dict[str, float]:
    """µs per place() call on `nodes` 8-GPU nodes (two NUMA nodes, xGMI links), the
    trace's pods arriving in order and staying (the cluster fills to ~75% of its GPUs):
    with the trace's task mix (FGD) and without (best fit). Only place() is timed."""
    _, pods = load()
    specs = [
        NodeSpec(
            name=f"n{i:05d}",
            cpus=960,  # 96 CPUs in tenths, as the trace counts them
            memory_mb=786_432,
            agent_url="trace://",
            sockets=2,
            gpus=tuple(
                GpuDevice(
                    index=g,
                    vendor="amd",
                    model="g2",
                    memory_mb=1,
                    numa=g // 4,
                    links=tuple((p, "xgmi") for p in range(8) if p != g),
                )
                for g in range(8)
            ),
        )
        for i in range(nodes)
    ]
    state = ClusterState()
    state.apply(c.ConfigurePartitions("p", 0.0, (c.PartitionDef(name="all", default=True),)))
    for spec in specs:
        state.apply(c.RegisterNode("r", 0.0, spec))
    out: dict[str, float] = {}
    for name in ("fgd", "best_fit"):
        mix = task_mix([p.job for p in pods]) if name == "fgd" else None
        free = FreeMap.of(state)
        spent = 0.0
        for pod in pods:
            t0 = time.perf_counter()
            allocs = place(state, pod.job, free, mix=mix)
            spent += time.perf_counter() - t0
            if allocs is not None:
                free.take(allocs)
        out[f"us_per_place_{name}"] = round(spent / len(pods) * 1e6, 1)
    return out


def replay_arrivals(
    state: ClusterState, pods: list[Pod], load: float = LOAD
) -> tuple[list[Pod], list[float], float]:
    """The pods that fit the (empty) cluster, their arrival times in seconds from the
    start (gaps clipped at the GAP_QUANTILE gap, then divided by the factor that
    offers `load` x the cluster's GPU capacity) and that factor."""
    empty = FreeMap.of(state)
    fits: dict[tuple[int, int, int, int], bool] = {}
    kept = []
    for pod in pods:
        shape = shape_of(pod)
        if shape not in fits:
            fits[shape] = first_fit(pod.job, empty) is not None
        if fits[shape]:
            kept.append(pod)
    clipped = clip_gaps([p.arrive for p in kept])
    capacity = sum(len(v.used) for v in empty.nodes) * 1000
    k = compression(clipped, [p.runtime for p in kept], [p.gpu_milli for p in kept], capacity, load)
    return kept, [a / k for a in clipped], k


def main() -> None:
    if "--timing" in sys.argv:
        print(json.dumps({"bench": "place_timing", "nodes": 1024, **timing(1024)}))
        return
    began = time.perf_counter()
    state, pods = load()
    # The typical task mix: every pod's shape, weighted by how often it occurs (the
    # FGD paper builds it from the whole trace); both the measure and ours use it.
    mix = task_mix([p.job for p in pods])
    small, _ = load(STRIDE)
    kept, arrive, factor = replay_arrivals(small, pods)

    def ours_on(on: ClusterState) -> Policy:
        return lambda job, free: place(on, job, free, mix=mix)

    results: dict[str, dict[str, float]] = {}
    for name in ("ours", "first_fit", "random"):
        policies: list[Policy] = (
            [ours_on(state), ours_on(small)]
            if name == "ours"
            else [first_fit] * 2
            if name == "first_fit"
            else [random_fit(random.Random(SEED)), random_fit(random.Random(SEED))]
        )
        full = arrive_until_full(state, pods, policies[0], mix)
        backfill = timed(small, kept, arrive, policies[1], mix)
        if name == "random":
            policies[1] = random_fit(random.Random(SEED))
        strict = timed(small, kept, arrive, policies[1], mix, samples=0, backfill=False)
        results[name] = {
            **full,
            **backfill,
            "strict_fifo_allocated_share": strict["time_avg_allocated_share"],
            "strict_fifo_mean_wait_s": strict["mean_wait_s"],
            "strict_fifo_p95_wait_s": strict["p95_wait_s"],
        }
    columns = list(results["ours"])
    gpus = sum(len(n.spec.gpus) for n in small.nodes.values())
    window = arrive[-1] - arrive[0]
    print(f"{len(state.nodes)} nodes, {len(pods)} pods, task mix of {len(mix)} GPU shapes")
    print(
        "arrive until full (rows allocated_share..pods_placed): pods arrive in creation "
        "order and never leave; fragmentation at 50..90% of capacity asked."
    )
    print(
        f"timed replay (rows time_avg_* .. strict_fifo_*): every {STRIDE}th node "
        f"({len(small.nodes)} nodes, {gpus} GPUs), {len(kept)} pods in creation order with "
        f"their runtimes (deletion - scheduled time); gaps clipped at the trace's "
        f"p{GAP_QUANTILE * 100:g} gap, then compressed {factor:.0f}x so the offered GPU "
        f"load is {LOAD} x capacity over the {window / 3600:.1f} h arrival window; "
        "pods that do not fit queue FIFO and start when they fit, same policy: with "
        "backfill (any queued pod that fits starts; *_wait_s) and strict FIFO (only the "
        "head starts; strict_fifo_*); wait = start - arrival, over all pods; "
        f"allocation and fragmentation time-averaged over the window ({FRAG_SAMPLES} "
        "samples)."
    )
    print(f"{'':<26}" + "".join(f"{name:>12}" for name in results))
    for col in columns:
        print(f"{col:<26}" + "".join(f"{row[col]:>12}" for row in results.values()))
    ff, us = results["first_fit"]["fragmented_gpus"], results["ours"]["fragmented_gpus"]
    reduction = round(1 - us / ff, 2) if ff else 0.0
    print(
        f"fragmented GPUs: ours {us} vs first fit {ff} ({reduction:.0%} fewer); "
        f"{time.perf_counter() - began:.0f} s"
    )
    print(
        json.dumps(
            {
                "bench": "placement_quality",
                **results,
                "fragmentation_reduction_vs_first_fit": reduction,
            }
        )
    )


if __name__ == "__main__":
    main()
