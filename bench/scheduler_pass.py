"""One full scheduling pass (priorities, limits, placement, backfill, preemption) at scale.

For each size, build a cluster of N nodes × 8 GPUs through real commands, fill it to
about 90% with running jobs that have time limits (the steady state of a busy cluster,
which gives backfill something to plan around), queue P pending mixed jobs (single-GPU,
fractional, 8-GPU, multi-node), and time `plan_pass` (median of five passes on the
same state, after a warm-up pass whose pending reasons are committed, as in steady
operation). Prints a table; the last line is one JSON object.

    python bench/scheduler_pass.py
    python bench/scheduler_pass.py --baseline /tmp/base --sizes 4096x50000

`--baseline DIR`: also time the scheduler of another checkout (DIR, its repository
root: `git worktree add /tmp/base <commit>`) in the same run, size by size before this
checkout, with this same script in a child process that imports DIR's `scheduler`
(which needs only the core API both share); the JSON line then carries
its results under "baseline" and the ratio per size under "speedup" (baseline ms over
ours). Only a ratio measured in one run on one machine means anything.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The scheduler timed: this checkout's, or the one a --baseline run names.
ROOT = os.environ.get("SCHEDULER_PASS_ROOT") or str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)

from scheduler.core import commands as c  # noqa: E402
from scheduler.core.contract import JobSpec  # noqa: E402
from scheduler.core.planner import plan_pass  # noqa: E402
from scheduler.core.resources import GpuDevice, NodeSpec  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402

SIZES = [(128, 1_000), (1_024, 10_000), (4_096, 50_000)]
SCRIPT = "#!/bin/sh\ntrue\n"


def node(i: int) -> NodeSpec:
    return NodeSpec(
        name=f"n{i:05d}",
        cpus=128,
        memory_mb=1_048_576,
        agent_url="http://127.0.0.1:1",
        sockets=2,
        cores_per_socket=64,
        gpus=tuple(
            GpuDevice(
                index=g,
                vendor="amd",
                model="mi300x",
                memory_mb=196_608,
                numa=g // 4,
                links=tuple((p, "xgmi") for p in range(8) if p != g),
            )
            for g in range(8)
        ),
    )


def mixed_spec(rng: random.Random, tenant: str) -> JobSpec:
    kind = rng.random()
    common = {"script": SCRIPT, "tenant": tenant, "user": tenant, "time_limit_min": 60}
    if kind < 0.45:
        return JobSpec(**common, gpus_per_node=1)
    if kind < 0.70:
        return JobSpec(**common, gpu_milli=rng.choice((250, 500)))
    if kind < 0.90:
        return JobSpec(**common, gpus_per_node=8)
    return JobSpec(**common, nodes=rng.choice((2, 4)), gpus_per_node=8)


def build(nodes: int, pending: int, seed: int = 7) -> tuple[ClusterState, float]:
    rng = random.Random(seed)
    state = ClusterState()
    now = 1_000_000.0
    state.apply(c.ConfigurePartitions("p", now, (c.PartitionDef(name="gpu", default=True),)))
    for i in range(nodes):
        state.apply(c.RegisterNode(f"r{i}", now, node(i)))
    tenants = [f"t{i}" for i in range(20)]
    # Fill about 90% of the GPUs with running 1- and 8-GPU jobs of staggered ages.
    target = int(nodes * 8 * 0.9)
    held = 0
    k = 0
    while held < target:
        gpus = 8 if rng.random() < 0.5 else 1
        spec = JobSpec(
            script=SCRIPT,
            tenant=rng.choice(tenants),
            user="u",
            gpus_per_node=gpus,
            time_limit_min=rng.choice((30, 60, 120, 240)),
        )
        state.apply(c.SubmitJob(f"fill{k}", now - rng.uniform(0, 3600), spec))
        held += gpus
        k += 1
    t = now - 3600
    while True:
        allocate = plan_pass(state, now=t, cmd_id=f"fill-plan{t}").allocate
        if allocate is None or not allocate.placements:
            break
        state.apply(allocate)
        t += 1
    for k in range(pending):
        state.apply(
            c.SubmitJob(f"q{k}", now - rng.uniform(0, 600), mixed_spec(rng, rng.choice(tenants)))
        )
    return state, now


def measure(sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    print(f"{'nodes':>6} {'GPUs':>7} {'pending':>8} {'ms/pass':>9} {'placed':>7} {'build s':>8}")
    for nodes, pending in sizes:
        t0 = time.perf_counter()
        state, now = build(nodes, pending)
        built = time.perf_counter() - t0
        # Steady state: the pending reasons the previous pass set are in the state
        # already (a pass commits only reasons that change).
        warm = plan_pass(state, now=now, cmd_id="warm").allocate
        if warm is not None:
            state.apply(c.Allocate("warm-reasons", now, reasons=warm.reasons))
        timings = []
        placed = 0
        for i in range(5):
            start = time.perf_counter()
            plan = plan_pass(state, now=now + i, cmd_id=f"bench{i}")
            timings.append((time.perf_counter() - start) * 1000)
            placed = len(plan.allocate.placements) if plan.allocate else 0
        ms = statistics.median(timings)
        results.append(
            {"nodes": nodes, "pending": pending, "ms_per_pass": round(ms, 1), "placed": placed}
        )
        print(f"{nodes:>6} {nodes * 8:>7} {pending:>8} {ms:>9.1f} {placed:>7} {built:>8.1f}")
    return results


def baseline(root: str, sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """This script in a child process, timing the scheduler of the checkout at `root`."""
    env = dict(os.environ, SCHEDULER_PASS_ROOT=str(Path(root).resolve()), PYTHONPATH="")
    spec = ",".join(f"{n}x{p}" for n, p in sizes)
    run = subprocess.run(
        [sys.executable, __file__, "--sizes", spec],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    lines = run.stdout.strip().splitlines()
    print("\n".join(lines[:-1]))
    results: list[dict[str, Any]] = json.loads(lines[-1])["results"]
    return results


def parse_sizes(text: str) -> list[tuple[int, int]]:
    try:
        sizes = [tuple(int(x) for x in item.split("x")) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are NODESxPENDING,...: {text!r}") from None
    if not sizes or any(len(s) != 2 or min(s) <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes are NODESxPENDING,...: {text!r}")
    return [(s[0], s[1]) for s in sizes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="DIR", help="also time this checkout's scheduler")
    parser.add_argument("--sizes", type=parse_sizes, default=SIZES, help="e.g. 4096x50000")
    args = parser.parse_args()
    if args.baseline and not (Path(args.baseline) / "scheduler" / "core").is_dir():
        parser.error(f"--baseline {args.baseline}: no scheduler/core there")
    out: dict[str, Any] = {"bench": "scheduler_pass"}
    if not args.baseline:
        out["results"] = measure(args.sizes)
    else:
        # Size by size, the baseline then this checkout, so that both of a pair see the
        # same moment of a shared machine.
        base: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for size in args.sizes:
            print(f"baseline: {args.baseline}")
            base += baseline(args.baseline, [size])
            print(f"this checkout: {ROOT}")
            results += measure([size])
        out["results"] = results
        out["baseline"] = base
        out["speedup"] = [
            {
                "nodes": b["nodes"],
                "pending": b["pending"],
                "ratio": round(b["ms_per_pass"] / max(r["ms_per_pass"], 0.1), 1),
            }
            for b, r in zip(base, results, strict=True)
        ]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
