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
2. Timed: pods arrive at `creation_time` and hold their resources for
   `deletion_time - scheduled_time` seconds (`creation_time` when never scheduled);
   a pod that does not fit waits in a first-come-first-served queue (later pods may
   pass a blocked one, as `plan()` does). Measured: time-averaged share of GPU capacity
   allocated, mean and p95 wait.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core import commands as c  # noqa: E402
from scheduler.core.freemap import FreeMap, NodeFree  # noqa: E402
from scheduler.core.jobs import Job, NodeAlloc  # noqa: E402
from scheduler.core.jobspec import JobSpec  # noqa: E402
from scheduler.core.placement import TaskMix, fragmentation, place, task_mix  # noqa: E402
from scheduler.core.resources import GpuDevice, NodeSpec  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "shared/reference/traces/alibaba-gpu-v2023"
CPU_UNIT = 100  # milli-CPUs per counted CPU
SEED = 20230710

Allocs = tuple[tuple[str, NodeAlloc], ...]
Policy = Callable[[Job, FreeMap], Allocs | None]


@dataclass(frozen=True)
class Pod:
    job: Job
    arrive: float
    runtime: float
    gpu_milli: int  # total GPU milli asked


def load() -> tuple[ClusterState, list[Pod]]:
    state = ClusterState()
    state.apply(c.ConfigurePartitions("p", 0.0, (c.PartitionDef(name="all", default=True),)))
    with (TRACE / "openb_node_list_gpu_node.csv").open() as f:
        for row in csv.DictReader(f):
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
    cpus, mem = spec.cpus_on_each_node, spec.mem_per_node_mb or 1
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


def timed(state: ClusterState, pods: list[Pod], policy: Policy) -> dict[str, float]:
    free = FreeMap.of(state)
    capacity = sum(len(v.used) for v in free.nodes) * 1000
    ends: list[tuple[float, int, Allocs, int]] = []
    queue: list[Pod] = []
    waits: list[float] = []
    used = 0
    area = 0.0
    last = pods[0].arrive

    def advance(to: float) -> None:
        nonlocal area, last
        area += used * (to - last)
        last = to

    def start(pod: Pod, now: float) -> bool:
        nonlocal used
        allocs = policy(pod.job, free)
        if allocs is None:
            return False
        free.take(allocs)
        used += pod.gpu_milli
        waits.append(now - pod.arrive)
        heapq.heappush(ends, (now + pod.runtime, pod.job.job_id, allocs, pod.gpu_milli))
        return True

    def drain(now: float) -> None:
        failed: set[object] = set()  # shapes that did not fit since the last release
        keep = []
        for pod in queue:
            shape = (pod.job.spec.cpus_on_each_node, pod.job.spec.mem_per_node_mb, pod.gpu_milli)
            if shape in failed or not start(pod, now):
                failed.add(shape)
                keep.append(pod)
        queue[:] = keep

    for pod in pods:
        while ends and ends[0][0] <= pod.arrive:
            end, _, allocs, milli = heapq.heappop(ends)
            advance(end)
            free.give(allocs)
            used -= milli
            drain(end)
        advance(pod.arrive)
        if queue or not start(pod, pod.arrive):
            queue.append(pod)
            drain(pod.arrive)
    while ends and queue:
        end, _, allocs, milli = heapq.heappop(ends)
        advance(end)
        free.give(allocs)
        used -= milli
        drain(end)
    span = last - pods[0].arrive
    waits.sort()
    return {
        "time_avg_allocated_share": round(area / span / capacity, 4) if span else 0.0,
        "mean_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "p95_wait_s": round(waits[int(0.95 * (len(waits) - 1))], 1) if waits else 0.0,
        "never_started": len(queue),
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
        mix = task_mix([p.job for p in pods], state) if name == "fgd" else None
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


def main() -> None:
    if "--timing" in sys.argv:
        print(json.dumps({"bench": "place_timing", "nodes": 1024, **timing(1024)}))
        return
    began = time.perf_counter()
    state, pods = load()
    # The typical task mix: every pod's shape, weighted by how often it occurs (the
    # FGD paper builds it from the whole trace); both the measure and ours use it.
    mix = task_mix([p.job for p in pods], state)

    def ours(job: Job, free: FreeMap) -> Allocs | None:
        return place(state, job, free, mix=mix)

    policies: dict[str, Policy] = {
        "ours": ours,
        "first_fit": first_fit,
        "random": random_fit(random.Random(SEED)),
    }
    results: dict[str, dict[str, float]] = {}
    for name, policy in policies.items():
        if name == "random":
            policy = random_fit(random.Random(SEED))
        full = arrive_until_full(state, pods, policy, mix)
        if name == "random":
            policy = random_fit(random.Random(SEED))
        results[name] = {**full, **timed(state, pods, policy)}
    columns = list(results["ours"])
    print(f"{len(state.nodes)} nodes, {len(pods)} pods, task mix of {len(mix)} GPU shapes")
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
