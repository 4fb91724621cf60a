"""End-to-end throughput and latency of the embedded platform.

Starts the platform the way `make up` does (SQLite, file-system Celery broker, one
controller, one worker) with four simulated 8 × MI300X nodes (the shape of the Slurm peer
in ../shared/peers/slurm), submits 200 one-GPU `true` jobs through the REST API from one
client, and waits for all of them. Prints a table and, last, one JSON line.

    python bench/e2e.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core import contract  # noqa: E402
from spurcloud.stack import Stack  # noqa: E402
from tests.fixtures.processes import free_port, free_port_range  # noqa: E402

JOBS = 200
NODES = [(f"node{i:02d}", "mi300x-8") for i in range(1, 5)]
TERMINAL = {state.value for state in contract.TERMINAL}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="spur-bench-") as tmp:
        # The organisations' accounts pass through it to their workspaces (as root).
        Path(tmp).chmod(0o711)
        stack = Stack(
            state_dir=Path(tmp) / "spur",
            web_port=free_port(),
            ctld_port=free_port(),
            raft_port=free_port(),
            agent_base_port=free_port_range(len(NODES)),
            nodes=NODES,
            quiet=True,
        )
        try:
            stack.prepare()
            stack.manage("migrate", "--noinput")
            creds = stack.seed()
            stack.start_all()
            stack.wait_ready(timeout=120)
            return run(stack, creds["token"])
        except Exception:
            for name in ("web", "worker", "spurctld"):
                log = stack.logs / f"{name}.log"
                if log.exists():
                    print(f"--- {name}.log (tail) ---", file=sys.stderr)
                    print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            stack.stop_all()


def run(stack: Stack, token: str) -> int:
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
    t0 = time.time()
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
    figures = {
        "bench": "e2e",
        "jobs": JOBS,
        "submit_jobs_per_s": round(JOBS / (t_submitted - t0), 1),
        "e2e_jobs_per_s": round(JOBS / (last_end - t0), 1),
        "latency_p50_ms": round(statistics.median(latencies), 1),
        "latency_p99_ms": round(percentile(latencies, 0.99), 1),
    }
    print(f"Spur-Cloud embedded platform: {len(NODES)} nodes x 8 GPUs, {JOBS} one-GPU `true` jobs")
    print(f"{'figure':<34}{'value':>12}")
    print(f"{'submitted through the API (jobs/s)':<34}{figures['submit_jobs_per_s']:>12}")
    print(f"{'end to end (jobs/s)':<34}{figures['e2e_jobs_per_s']:>12}")
    print(f"{'submit -> script start p50 (ms)':<34}{figures['latency_p50_ms']:>12}")
    print(f"{'submit -> script start p99 (ms)':<34}{figures['latency_p99_ms']:>12}")
    print(f"{'final states':<34}{json.dumps(states):>12}")
    print(json.dumps(figures))
    return 0 if states.get("COMPLETED") == JOBS else 1


if __name__ == "__main__":
    sys.exit(main())
