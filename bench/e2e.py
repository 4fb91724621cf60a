"""End-to-end throughput and latency of the embedded platform, beside real Slurm.

Starts the platform the way `make up` does (SQLite, file-system Celery broker, one
controller, one worker) with four simulated 8 × MI300X nodes (the shape of the Slurm peer
in ../shared/peers/slurm), submits 200 one-GPU `true` jobs through the REST API from one
client, and waits for all of them. Then, if the Slurm peer is up (its README: `up.sh`;
it listens on 7817-7834, beside the platform), runs its `bench.sh 200` (200 one-GPU
`true` jobs from a shell loop of `sbatch`) in the same run, reads its jobs' submit and
start times from `sacct`, and prints both and the ratio. Prints a table and, last, one
JSON line. Also prints where the CPU went while the jobs went through: milliseconds of
CPU a job in each platform process (user and system, from /proc), with the processes it
started (an agent's: the jobs' supervisors and sandboxes, and the jobs), and in the rest
of the machine (the client, and anything else that ran): a figure that a busy machine
changes far less than a rate.

    python bench/e2e.py                # one controller
    python bench/e2e.py --replicas 3   # the same load against three (a Raft group)
    python bench/e2e.py --broker redis # Celery over Redis (REDIS_URL, else db 0 on
                                       # localhost) instead of the file-system broker
    python bench/e2e.py --bulk         # submit in lists of 100 (POST /api/v1/jobs with
                                       # a list): the pipeline after commit, not the
                                       # submit path, sets the pace
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from embedded import on_platform  # noqa: E402
from proctree import cpu_seconds  # noqa: E402

from scheduler.core import contract  # noqa: E402
from spurcloud.stack import Stack  # noqa: E402

JOBS = 200
BULK = 100  # the web API's API_MAX_BULK_SUBMIT
NODES = [(f"node{i:02d}", "mi300x-8") for i in range(1, 5)]
SLURM_PEER = ROOT.parent / "shared" / "peers" / "slurm"
SLURM_CONF = Path("/tmp/slurmpeer/etc/slurm.conf")
TERMINAL = {state.value for state in contract.TERMINAL}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="End-to-end throughput, beside Slurm.")
    parser.add_argument("--replicas", type=int, default=1, choices=(1, 3, 5))
    parser.add_argument(
        "--broker",
        choices=("filesystem", "redis"),
        default="filesystem",
        help="the Celery broker (default: the embedded platform's, the file system)",
    )
    parser.add_argument(
        "--bulk", action="store_true", help="submit in lists of 100, not one job a request"
    )
    args = parser.parse_args(argv)
    # Before the platform writes its spur.toml (the controller's broker_url is in it); only
    # the broker: the cache and the Channels layer stay the embedded ones.
    redis = os.environ.pop("REDIS_URL", "") or "redis://127.0.0.1:6379/0"
    if args.broker == "redis":
        os.environ["CELERY_BROKER_URL"] = redis
    else:
        os.environ.pop("CELERY_BROKER_URL", None)
    return on_platform(
        "spur-bench-",
        NODES,
        lambda stack, creds: run(stack, creds["token"], args.replicas, args.broker, args.bulk),
        replicas=args.replicas,
        ready_s=120,
    )


def run(stack: Stack, token: str, replicas: int, broker: str, bulk: bool) -> int:
    spec = {
        "script": "#!/bin/sh\ntrue\n",
        "name": "bench",
        "gpus_per_node": 1,
        "stdout": "/dev/null",
        "stderr": "/dev/null",
    }
    web = httpx.Client(
        base_url=stack.web_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    ctld = httpx.Client(
        base_url=stack.ctld_url,
        headers={"Authorization": f"Bearer {stack.env['SPUR_CLUSTER_TOKEN']}"},
        timeout=30,
    )
    ids = []
    cpu_before = cpu_times(stack)
    t0 = time.time()
    if bulk:
        for start in range(0, JOBS, BULK):
            answer = web.post("/api/v1/jobs", json=[spec] * min(BULK, JOBS - start))
            answer.raise_for_status()
            ids += [result["job_id"] for result in answer.json()["results"]]
    else:
        for _ in range(JOBS):
            answer = web.post("/api/v1/jobs", json=spec)
            answer.raise_for_status()
            ids.append(answer.json()["job_id"])
    t_submitted = time.time()

    # Poll only the jobs still active (a cheap answer), then read them all once: a
    # benchmark that polls every job's full record would measure its own polling.
    wanted = ",".join(str(i) for i in ids)
    active = "PENDING,RUNNING,COMPLETING"
    deadline = time.monotonic() + 300
    while ctld.get("/v1/jobs", params={"ids": wanted, "states": active}).json()["jobs"]:
        if time.monotonic() > deadline:
            print("timed out waiting for the jobs", file=sys.stderr)
            return 1
        time.sleep(0.1)
    cpu_after = cpu_times(stack)
    jobs = {j["job_id"]: j for j in ctld.get("/v1/jobs", params={"ids": wanted}).json()["jobs"]}
    if len(jobs) != JOBS or any(j["state"] not in TERMINAL for j in jobs.values()):
        print("jobs missing or not ended", file=sys.stderr)
        return 1

    states: dict[str, int] = {}
    for j in jobs.values():
        states[j["state"]] = states.get(j["state"], 0) + 1
    last_end = max(j["end_time"] for j in jobs.values())
    latencies = [
        (j["started_at"] - j["submit_time"]) * 1000 for j in jobs.values() if j["started_at"]
    ]
    figures: dict[str, object] = {
        "bench": "e2e",
        "broker": broker,
        "submit": "bulk" if bulk else "one by one",
        "jobs": JOBS,
        "submit_jobs_per_s": round(JOBS / (t_submitted - t0), 1),
        "e2e_jobs_per_s": round(JOBS / (last_end - t0), 1),
        "latency_p50_ms": round(statistics.median(latencies), 1),
        "latency_p99_ms": round(percentile(latencies, 0.99), 1),
    }
    slurm = slurm_figures()
    figures["slurm_e2e_jobs_per_s"] = slurm.get("throughput_jobs_per_s")
    ours, theirs = figures["e2e_jobs_per_s"], figures["slurm_e2e_jobs_per_s"]
    ratio = None
    if isinstance(ours, float) and isinstance(theirs, float) and theirs:
        ratio = round(ours / theirs, 2)
    figures["ratio_vs_slurm"] = ratio
    print(
        f"Spur-Cloud embedded platform: {replicas} controller(s), {len(NODES)} nodes x 8 GPUs, "
        f"{JOBS} one-GPU `true` jobs, {broker} broker"
        + (f", submitted in lists of {BULK}" if bulk else "")
    )
    print("Slurm 22.05 peer: " + ("bench.sh, same run" if slurm else "not running"))
    print(f"{'figure':<34}{'spur':>10}{'slurm':>10}")
    rows = [
        ("submitted (jobs/s)", "submit_jobs_per_s", "submit_rate_jobs_per_s"),
        ("end to end (jobs/s)", "e2e_jobs_per_s", "throughput_jobs_per_s"),
        ("submit -> start p50 (ms)", "latency_p50_ms", "latency_p50_ms"),
        ("submit -> start p99 (ms)", "latency_p99_ms", "latency_p99_ms"),
    ]
    for label, key, peer in rows:
        print(f"{label:<34}{figures[key]!s:>10}{slurm.get(peer, '-')!s:>10}")
    print(f"{'end to end, spur / slurm':<34}{ratio if ratio is not None else '-'!s:>10}")
    print(f"{'final states':<34}{json.dumps(states):>12}")
    print("(Slurm's times come from sacct, to the second: its latencies are coarse.)")
    print_cpu(cpu_before, cpu_after)
    print(json.dumps(figures))
    return 0 if states.get("COMPLETED") == JOBS else 1


def cpu_times(stack: Stack) -> dict[str, float]:
    """CPU seconds so far of each platform process with what it started (bench/proctree.py),
    "<name> +" the share of what it started, and of the whole machine ("machine", every
    core busy)."""
    out: dict[str, float] = {}
    found = cpu_seconds({name: proc.pid for name, proc in stack.procs.items()})
    for name, (own, started) in found.items():
        out[name] = own + started
        out[f"{name} +"] = started
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    out["machine"] = (sum(cpu) - cpu[3] - cpu[4]) / os.sysconf("SC_CLK_TCK")  # not idle
    # This process: the client that submits and polls (as a tenant's tool would).
    out["the benchmark's client"] = sum(os.times()[:2])
    return out


def print_cpu(before: dict[str, float], after: dict[str, float]) -> None:
    """Where the CPU went while the jobs went through: milliseconds a job in each
    process (with what it started: "of which started" is that share), in the benchmark's
    own client (submitting and polling), and in the rest of the machine (the kernel's
    threads, and whatever else ran meanwhile)."""
    spent = {name: after[name] - before[name] for name in after if name in before}
    machine = spent.pop("machine", 0.0)
    started = {name[:-2]: spent.pop(name) for name in list(spent) if name.endswith(" +")}
    print(f"CPU a job, ms (submission to last end; the machine: {machine:.1f} s in all)")
    print(f"  {'process':<32}{'all':>10}{'of which started':>18}")
    label = "the benchmark's client"
    client = spent.pop(label, 0.0)
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {name:<32}{seconds * 1000 / JOBS:>10.1f}{started[name] * 1000 / JOBS:>18.1f}")
    print(f"  {label:<32}{client * 1000 / JOBS:>10.1f}")
    rest = machine - sum(spent.values()) - client
    print(f"  {'the rest of the machine':<32}{rest * 1000 / JOBS:>10.1f}")


def slurm_figures() -> dict[str, float]:
    """The Slurm peer's bench.sh figures, and its jobs' submit -> start latency from
    sacct; {} if the peer is not up."""
    env = {**os.environ, "SLURM_CONF": str(SLURM_CONF)}
    script = SLURM_PEER / "bench.sh"
    if not (script.exists() and SLURM_CONF.exists() and shutil.which("sbatch", path="/usr/bin")):
        return {}
    ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return {}
    since = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    done = subprocess.run(["bash", str(script), str(JOBS)], env=env, capture_output=True, text=True)
    figures: dict[str, float] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            figures[key.strip()] = float(value)
    if "throughput_jobs_per_s" not in figures:
        print(f"Slurm peer bench failed: {done.stdout[-500:]}{done.stderr[-500:]}", file=sys.stderr)
        return {}
    history = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-S", since, "-o", "JobName,Submit,Start"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    waits = []
    for line in history.stdout.splitlines():
        name, submit, start = (line.split("|") + ["", "", ""])[:3]
        if name.startswith("bench_") and "T" in submit and "T" in start:
            waits.append(
                (datetime.fromisoformat(start) - datetime.fromisoformat(submit)).total_seconds()
            )
    if waits:
        figures["latency_p50_ms"] = round(statistics.median(waits) * 1000, 1)
        figures["latency_p99_ms"] = round(percentile(waits, 0.99) * 1000, 1)
    return figures


if __name__ == "__main__":
    sys.exit(main())
