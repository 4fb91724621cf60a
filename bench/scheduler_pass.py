"""One full scheduling pass (priorities, limits, placement, backfill, preemption) at scale.

For each size, build a cluster of N nodes × 8 GPUs through real commands, fill it to
about 90% with running jobs that have time limits (the steady state of a busy cluster,
which gives backfill something to plan around), queue P pending tasks, and time
`plan_pass` (median of five passes on the same state, after a warm-up pass whose pending
reasons are committed, as in steady operation). Prints a table; the last line is one
JSON object. Each size is timed twice: a pass that places what fits (five passes on the
same state, its placements not committed: the pass after a change that frees
resources), and an idle one once that plan is committed (`idle`: nothing more fits,
the pass a busy cluster runs most often). The five passes on one state reuse what the
state derives and keeps until a command changes what nodes hold (the free map, and the
shadows of the future where the scheduler timed keeps them); `cold` is the same pass
right after such a command (a drain and resume of one node), which rebuilds them. Wall
and CPU time are both shown. `starts` is the idle pass that also estimates the blocked
jobs' starts (`estimate=True`, which the leader asks for every few seconds for squeue
--start), where the scheduler timed has it.

The pending tasks are what a shared cluster holds (`queue`): of every 100, about 64
plain jobs of mixed shapes (single-GPU, fractional, 8-GPU, 2- and 4-node gangs) from 20
tenants with 30 to 240-minute limits, 8 held, 8 waiting on a running job (afterok), 3
on a pending one (a pipeline's next step), 2 with a begin time hours ahead, and 15 in
arrays of 100 one-GPU or half-GPU tasks, a third of them throttled to 10 at once.

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
import gc
import inspect
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


ARRAY_TASKS = 100


def queue(
    state: ClusterState, rng: random.Random, tenants: list[str], pending: int, now: float
) -> None:
    """Submit `pending` tasks as described above, in a random order of kinds."""
    # A dependency names a job of the same tenant (another's is unknown to it).
    running: dict[str, list[int]] = {t: [] for t in tenants}
    for job in state.jobs.values():
        if job.state.value == "RUNNING":
            running[job.spec.tenant].append(job.job_id)
    submitted: dict[str, list[int]] = {t: [] for t in tenants}
    left, k = pending, 0
    while left > 0:
        tenant = rng.choice(tenants)
        at = now - rng.uniform(0, 600)
        kind = rng.random()
        spec = mixed_spec(rng, tenant)
        extra: dict[str, Any] = {}
        # 15 tasks in 100 are in arrays: one array per 100/0.15 plain submissions' worth.
        if kind < 0.15 / (ARRAY_TASKS * 0.85 + 0.15) and left >= ARRAY_TASKS:
            throttle = "%10" if rng.random() < 1 / 3 else ""
            spec = JobSpec(
                script=SCRIPT,
                tenant=tenant,
                user=tenant,
                time_limit_min=rng.choice((30, 60, 120)),
                array=f"0-{ARRAY_TASKS - 1}{throttle}",
                **({"gpus_per_node": 1} if rng.random() < 0.5 else {"gpu_milli": 500}),
            )
            left -= ARRAY_TASKS
        else:
            left -= 1
            mix = rng.random()
            if mix < 0.08:
                extra = {"hold": True}
            elif mix < 0.16 and running[tenant]:
                extra = {"dependency": f"afterok:{rng.choice(running[tenant])}"}
            elif mix < 0.19 and submitted[tenant]:
                extra = {"dependency": f"afterok:{rng.choice(submitted[tenant][-20:])}"}
            elif mix < 0.21:
                extra = {"begin_time": now + rng.uniform(3600, 6 * 3600)}
        spec = spec.replace(**extra) if extra else spec
        state.apply(c.SubmitJob(f"q{k}", at, spec))
        submitted[tenant].append(state.submissions[f"q{k}"])
        k += 1


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
    queue(state, rng, tenants, pending, now)
    return state, now


# Whether the scheduler timed estimates starts (a --baseline checkout may be older).
ESTIMATES = "estimate" in inspect.signature(plan_pass).parameters


def timed(
    state: ClusterState, now: float, tag: str, *, cold: bool = False, **kw: Any
) -> tuple[float, float, int]:
    """Median wall and CPU milliseconds of five passes on the same state, and how many
    jobs the last one placed. CPU time is the pass's own: on a shared machine the wall
    time also holds whatever else ran meanwhile. `cold`: each pass right after a command
    that changes what a node offers (it drains and resumes the last node)."""
    wall, cpu = [], []
    placed = 0
    for i in range(5):
        if cold:
            name = max(state.nodes)
            state.apply(c.DrainNode(f"{tag}-drain{i}", now + i, name, reason="bench"))
            state.apply(c.ResumeNode(f"{tag}-resume{i}", now + i, name))
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = plan_pass(state, now=now + i, cmd_id=f"{tag}{i}", **kw)
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
        placed = len(plan.allocate.placements) if plan.allocate else 0
    return statistics.median(wall), statistics.median(cpu), placed


def measure(sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    print(
        f"{'nodes':>6} {'GPUs':>7} {'pending':>8} {'ms/pass':>9} {'cpu ms':>8} {'placed':>7}"
        f" {'cold ms':>8} {'idle ms':>8} {'starts ms':>9} {'build s':>8}"
    )
    for nodes, pending in sizes:
        t0 = time.perf_counter()
        state, now = build(nodes, pending)
        built = time.perf_counter() - t0
        # Steady state: the pending reasons the previous pass set are in the state
        # already (a pass commits only reasons that change).
        warm = plan_pass(state, now=now, cmd_id="warm").allocate
        if warm is not None:
            state.apply(c.Allocate("warm-reasons", now, reasons=warm.reasons))
        # The build's garbage is collected first: a pass in steady operation does not
        # pay for the collection that millions of new objects are due.
        gc.collect()
        ms, cpu_ms, placed = timed(state, now, "bench")
        # Each phase after the last (a pass at an earlier time than the last one rebuilds
        # the kept ranking, where the scheduler timed keeps one).
        cold_ms, _, _ = timed(state, now + 5, "cold", cold=True)
        # And once what fits has started (the pass's plan committed whole): the pass a
        # busy cluster runs on every change that frees nothing.
        start = plan_pass(state, now=now + 10, cmd_id="start").allocate
        if start is not None:
            state.apply(start)
            again = plan_pass(state, now=now + 11, cmd_id="settle").allocate
            if again is not None:
                state.apply(c.Allocate("settle-reasons", now + 11, reasons=again.reasons))
        idle_ms, _, _ = timed(state, now + 12, "idle")
        starts = timed(state, now + 17, "starts", estimate=True)[0] if ESTIMATES else None
        results.append(
            {
                "nodes": nodes,
                "pending": pending,
                "ms_per_pass": round(ms, 1),
                "cpu_ms_per_pass": round(cpu_ms, 1),
                "placed": placed,
                "cold_ms_per_pass": round(cold_ms, 1),
                "idle_ms_per_pass": round(idle_ms, 1),
                "starts_ms_per_pass": None if starts is None else round(starts, 1),
            }
        )
        print(
            f"{nodes:>6} {nodes * 8:>7} {pending:>8} {ms:>9.1f} {cpu_ms:>8.1f} {placed:>7}"
            f" {cold_ms:>8.1f} {idle_ms:>8.1f}"
            f" {'-' if starts is None else f'{starts:.1f}':>9} {built:>8.1f}"
        )
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
                "cpu_ratio": round(b["cpu_ms_per_pass"] / max(r["cpu_ms_per_pass"], 0.1), 1),
                "cold_ratio": round(b["cold_ms_per_pass"] / max(r["cold_ms_per_pass"], 0.1), 1),
                "idle_ratio": round(b["idle_ms_per_pass"] / max(r["idle_ms_per_pass"], 0.1), 1),
            }
            for b, r in zip(base, results, strict=True)
        ]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
