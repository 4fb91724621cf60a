"""The Celery worker's CPU a job on the embedded platform (bench/e2e.py's load: four
simulated nodes, one-GPU `true` jobs submitted one by one), read from /proc (user and
system, the worker process's own) before and after each round, and the lines its log
grew by.

    python bench/worker_cpu.py                 # 5 rounds of 200 jobs, this tree
    python bench/worker_cpu.py --serve         # one round per "go" line on stdin

`--serve` is for comparing two trees in one run, rounds interleaved (the machine's speed
drifts more than the difference): a driver starts each tree's platform with
`<tree>/.venv/bin/python <tree>/bench/worker_cpu.py --serve`, waits for its "ready"
line, then sends "go" to each in turn and reads one JSON line of figures a round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
from e2e import LIMITS, NODES, WARMUP, clients, one_round  # noqa: E402
from embedded import on_platform  # noqa: E402

from spurcloud.stack import Stack  # noqa: E402


def worker_cpu_s(pid: int) -> float:
    """The process's own CPU seconds (utime + stime), all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(stack: Stack, web: httpx.Client, ctld: httpx.Client, jobs: int) -> dict[str, float]:
    pid = stack.procs["worker"].pid
    log = stack.logs / "worker.log"
    lines_before = log.read_bytes().count(b"\n")
    before = worker_cpu_s(pid)
    done = one_round(web, ctld, bulk=False, jobs=jobs)
    after = worker_cpu_s(pid)
    lines = log.read_bytes().count(b"\n") - lines_before
    if done is None:
        raise RuntimeError("the round's jobs did not all end")
    return {
        "worker_ms_per_job": round((after - before) * 1000 / jobs, 3),
        "e2e_jobs_per_s": done["e2e"],
        "log_lines_per_job": round(lines / jobs, 2),
        "completed": done["states"].get("COMPLETED", 0),
    }


def run(stack: Stack, token: str, rounds: int, jobs: int, serve: bool) -> int:
    web, ctld = clients(stack, token)
    if one_round(web, ctld, bulk=False, jobs=WARMUP) is None:
        return 1
    if serve:
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                break
            print(json.dumps(measure(stack, web, ctld, jobs)), flush=True)
        return 0
    figures = [measure(stack, web, ctld, jobs) for _ in range(rounds)]
    for figure in figures:
        print(json.dumps(figure))
    ms = statistics.median(f["worker_ms_per_job"] for f in figures)
    print(f"worker CPU a job, median of {rounds} rounds of {jobs}: {ms:.2f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The Celery worker's CPU a job.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--serve", action="store_true", help='one round per "go" on stdin')
    args = parser.parse_args(argv)
    os.environ.pop("CELERY_BROKER_URL", None)  # the embedded platform's file-system broker
    os.environ.pop("REDIS_URL", None)
    return on_platform(
        "spur-workercpu-",
        NODES,
        lambda stack, creds: run(stack, creds["token"], args.rounds, args.jobs, args.serve),
        env=LIMITS,
        ready_s=120,
    )


if __name__ == "__main__":
    sys.exit(main())
