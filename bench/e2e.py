"""End-to-end throughput and latency of the embedded platform, beside real Slurm.

Starts the platform the way `make up` does (SQLite, file-system Celery broker, one
controller, one worker) with four simulated 8 × MI300X nodes (the shape of the Slurm peer
in ../shared/peers/slurm). Then, ROUNDS times: submits 200 one-GPU `true` jobs through
the REST API from one client and waits for all of them; then, if the Slurm peer is up
(its README: `up.sh`; it listens on 7817-7834, beside the platform), runs its `bench.sh
200` (200 one-GPU `true` jobs from a shell loop of `sbatch`) and reads its jobs' submit
and start times from `sacct`. Prints each round's figures and ratio, then the medians: the
ratio is the median of the rounds' own ratios, each of two runs that followed each other
(this machine's speed drifts by more than Slurm's and ours differ from round to round;
one pair of runs read 2.15 and the next 1.38). Prints a table and, last, one JSON line.
Also prints where the CPU went while our jobs went through: milliseconds of CPU a job in
each platform process (user and system, from /proc), with the processes it started (an
agent's: the jobs' supervisors and sandboxes, and the jobs), and in the rest of the
machine (the client, the kernel's threads, and the processes that outlived their parent:
bubblewrap's pid 1 of a job's namespace often ends after its parent, and init reaps it):
a figure that a busy machine changes far less than a rate.

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
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from embedded import on_platform  # noqa: E402
from proctree import cpu_seconds  # noqa: E402

from scheduler.core import contract  # noqa: E402
from spurcloud.stack import Stack  # noqa: E402

JOBS = 200  # a round's
# Five: Slurm's own figure moves between about 25 and 60 jobs/s from one round to the
# next on one machine, so a round's ratio moves as much; the median of three still did.
ROUNDS = 5
WARMUP = 20  # jobs, before the rounds
# The rounds submit more than the web lets one organisation submit in a minute (as it
# should in production): raised for the bench only.
LIMITS = {
    "API_REQUESTS_PER_MINUTE_PER_TOKEN": "10000000",
    "API_REQUESTS_PER_MINUTE_PER_IP": "10000000",
    "API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION": "10000000",
}
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
        env=LIMITS,
        replicas=args.replicas,
        ready_s=120,
    )


SPEC = {
    "script": "#!/bin/sh\ntrue\n",
    "name": "bench",
    "gpus_per_node": 1,
    "stdout": "/dev/null",
    "stderr": "/dev/null",
}


def clients(stack: Stack, token: str) -> tuple[httpx.Client, httpx.Client]:
    """The tenant's client of the web API (`token`), and the cluster's of the controller
    (which the rounds poll for their jobs' states)."""
    web = httpx.Client(
        base_url=stack.web_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    ctld = httpx.Client(
        base_url=stack.ctld_url,
        headers={"Authorization": f"Bearer {stack.env['SPUR_CLUSTER_TOKEN']}"},
        timeout=30,
    )
    return web, ctld


def run(stack: Stack, token: str, replicas: int, broker: str, bulk: bool) -> int:
    web, ctld = clients(stack, token)
    # Not counted: the first jobs pay once what no later one does (the organisation's
    # account on each node, each agent's job supervisor, the processes' lazy imports);
    # Slurm's daemons are long since warm.
    if one_round(web, ctld, bulk, jobs=WARMUP) is None:
        return 1
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, float]] = []
    cpu_spent: dict[str, float] = {}
    for _ in range(ROUNDS):
        cpu_before = cpu_times(stack)
        done = one_round(web, ctld, bulk)
        cpu_after = cpu_times(stack)
        if done is None:
            return 1
        ours.append(done)
        for name, seconds in cpu_after.items():
            cpu_spent[name] = cpu_spent.get(name, 0.0) + seconds - cpu_before.get(name, 0.0)
        theirs.append(slurm_figures())

    states: dict[str, int] = {}
    for done in ours:
        for state, count in done["states"].items():
            states[state] = states.get(state, 0) + count
    latencies = [ms for done in ours for ms in done["latencies"]]
    slurm_latencies = [ms for peer in theirs for ms in peer.get("latencies", [])]
    ratios = [
        round(done["e2e"] / peer["throughput_jobs_per_s"], 2)
        for done, peer in zip(ours, theirs, strict=True)
        if peer.get("throughput_jobs_per_s")
    ]
    figures: dict[str, object] = {
        "bench": "e2e",
        "broker": broker,
        "submit": "bulk" if bulk else "one by one",
        "replicas": replicas,
        "rounds": ROUNDS,
        "jobs": JOBS,
        "submit_jobs_per_s": median([done["submit"] for done in ours]),
        "e2e_jobs_per_s": median([done["e2e"] for done in ours]),
        "latency_p50_ms": round(statistics.median(latencies), 1),
        "latency_p99_ms": round(percentile(latencies, 0.99), 1),
        "slurm_e2e_jobs_per_s": median([p["throughput_jobs_per_s"] for p in theirs if p]),
        "slurm_latency_p50_ms": (
            round(statistics.median(slurm_latencies), 1) if slurm_latencies else None
        ),
        # The median of each round's own ratio: a round's two figures were measured minutes
        # apart at most, and the machine's speed drifts more than that between rounds.
        "ratio_vs_slurm": median(ratios),
        "ratios": ratios,
    }
    print(
        f"Spur-Cloud embedded platform: {replicas} controller(s), {len(NODES)} nodes x 8 GPUs, "
        f"{JOBS} one-GPU `true` jobs a round, {broker} broker"
        + (f", submitted in lists of {BULK}" if bulk else "")
    )
    print(
        "Slurm 22.05 peer: "
        + ("its bench.sh after ours in each round" if any(theirs) else "not running")
    )
    print(f"{'round':<8}{'spur submit/s':>15}{'spur e2e/s':>12}{'slurm e2e/s':>13}{'ratio':>8}")
    for index, (done, peer) in enumerate(zip(ours, theirs, strict=True), 1):
        slurm = peer.get("throughput_jobs_per_s")
        ratio = round(done["e2e"] / slurm, 2) if slurm else "-"
        print(f"{index:<8}{done['submit']:>15}{done['e2e']:>12}{slurm or '-'!s:>13}{ratio!s:>8}")
    print(f"{'figure (median of the rounds)':<34}{'spur':>10}{'slurm':>10}")
    slurm_submit = median([p["submit_rate_jobs_per_s"] for p in theirs if p])
    rows = [
        ("submitted (jobs/s)", figures["submit_jobs_per_s"], slurm_submit),
        ("end to end (jobs/s)", figures["e2e_jobs_per_s"], figures["slurm_e2e_jobs_per_s"]),
        ("submit -> start p50 (ms)", figures["latency_p50_ms"], figures["slurm_latency_p50_ms"]),
        ("submit -> start p99 (ms)", figures["latency_p99_ms"], None),
    ]
    for label, spur, slurm in rows:
        print(f"{label:<34}{spur!s:>10}{slurm if slurm is not None else '-'!s:>10}")
    ratio = figures["ratio_vs_slurm"]
    print(f"{'end to end, spur / slurm':<34}{ratio if ratio is not None else '-'!s:>10}")
    print(f"{'final states':<34}{json.dumps(states):>12}")
    print("(Slurm's times come from sacct, to the second: its latencies are coarse.)")
    print_cpu(cpu_spent, ROUNDS * JOBS)
    print(json.dumps(figures))
    return 0 if states.get("COMPLETED") == ROUNDS * JOBS else 1


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def one_round(
    web: httpx.Client, ctld: httpx.Client, bulk: bool, jobs: int = JOBS
) -> dict[str, Any] | None:
    """`jobs` jobs submitted and waited for: the rates, each job's submit -> start latency
    (ms), and their final states; None if they did not all end."""
    ids = []
    t0 = time.time()
    if bulk:
        for start in range(0, jobs, BULK):
            answer = web.post("/api/v1/jobs", json=[SPEC] * min(BULK, jobs - start))
            answer.raise_for_status()
            ids += [result["job_id"] for result in answer.json()["results"]]
    else:
        for _ in range(jobs):
            answer = web.post("/api/v1/jobs", json=SPEC)
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
            return None
        time.sleep(0.1)
    found = {j["job_id"]: j for j in ctld.get("/v1/jobs", params={"ids": wanted}).json()["jobs"]}
    if len(found) != jobs or any(j["state"] not in TERMINAL for j in found.values()):
        print("jobs missing or not ended", file=sys.stderr)
        return None
    states: dict[str, int] = {}
    for j in found.values():
        states[j["state"]] = states.get(j["state"], 0) + 1
    last_end = max(j["end_time"] for j in found.values())
    return {
        "submit": round(jobs / (t_submitted - t0), 1),
        "e2e": round(jobs / (last_end - t0), 1),
        "latencies": [
            (j["started_at"] - j["submit_time"]) * 1000 for j in found.values() if j["started_at"]
        ],
        "states": states,
    }


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


def print_cpu(spent: dict[str, float], jobs: int) -> None:
    """Where the CPU went while the jobs went through: milliseconds a job in each
    process (with what it started: "of which started" is that share), in the benchmark's
    own client (submitting and polling), and in the rest of the machine (the kernel's
    threads, and whatever else ran meanwhile)."""
    spent = dict(spent)
    machine = spent.pop("machine", 0.0)
    started = {name[:-2]: spent.pop(name) for name in list(spent) if name.endswith(" +")}
    print(f"CPU a job, ms (submission to last end; the machine: {machine:.1f} s in all)")
    print(f"  {'process':<32}{'all':>10}{'of which started':>18}")
    label = "the benchmark's client"
    client = spent.pop(label, 0.0)
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {name:<32}{seconds * 1000 / jobs:>10.1f}{started[name] * 1000 / jobs:>18.1f}")
    print(f"  {label:<32}{client * 1000 / jobs:>10.1f}")
    rest = machine - sum(spent.values()) - client
    print(f"  {'the rest of the machine':<32}{rest * 1000 / jobs:>10.1f}")


def slurm_figures() -> dict[str, Any]:
    """The Slurm peer's bench.sh figures, and its jobs' submit -> start latencies (ms)
    from sacct; {} if the peer is not up."""
    env = {**os.environ, "SLURM_CONF": str(SLURM_CONF)}
    script = SLURM_PEER / "bench.sh"
    if not (script.exists() and SLURM_CONF.exists() and shutil.which("sbatch", path="/usr/bin")):
        return {}
    ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return {}
    since = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    done = subprocess.run(["bash", str(script), str(JOBS)], env=env, capture_output=True, text=True)
    figures: dict[str, Any] = {}
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
    figures["latencies"] = [seconds * 1000 for seconds in waits]
    return figures


if __name__ == "__main__":
    sys.exit(main())
