"""The web process's CPU for each job submitted through the API (POST /api/v1/jobs, one
job a request), of this checkout and of others (each a worktree with its own .venv),
interleaved in one run.

Each checkout's embedded platform (bench/embedded.py: SQLite, one simulated node) is
started by that checkout's own interpreter, so its web serves its own code. Then rounds:
each platform in turn gets `--jobs` held jobs (`"hold": true`: nothing launches, only the
submit path runs) from one client, one by one, and the web process's CPU (user and
system, every thread, from /proc) before and after says its milliseconds a submission.
The machine's noise moves all of them alike within a round; the medians of the rounds
are compared. The rate limits are raised for the run (they still count every request).

    python bench/submit_cpu.py --against /work/wt/base         # this checkout and base
    python bench/submit_cpu.py --rounds 8 --jobs 150 --prepaid  # a prepaid organisation:
                                                                # the price book is read
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
SPEC = {"script": "#!/bin/sh\ntrue\n", "name": "held", "gpus_per_node": 1, "hold": True}
# Counted as always, never reached.
LIMITS = {
    "API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION": "1000000",
    "API_REQUESTS_PER_MINUTE_PER_TOKEN": "1000000",
    "API_REQUESTS_PER_MINUTE_PER_IP": "1000000",
}


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(root: Path, prepaid: bool) -> int:
    """Starts `root`'s platform, says where it is (one JSON line), and keeps it up until
    stdin closes."""
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "bench"))
    from embedded import on_platform

    def up(stack: Any, creds: dict[str, str]) -> int:
        if prepaid:
            mode = "from spurcloud.billing.services import set_billing_mode as s; "
            mode += "from spurcloud.tenants.models import Organization as O; "
            mode += f"s(organization=O.objects.get(slug={creds['organization']!r}), "
            mode += "mode='prepaid')"
            stack.manage("shell", "-c", mode)
        web = stack.procs["web"].pid
        print(json.dumps({"url": stack.web_url, "token": creds["token"], "pid": web}), flush=True)
        sys.stdin.read()
        return 0

    return on_platform("spur-submit-cpu-", [("node01", "mi300x-8")], up, env=LIMITS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", action="append", default=[], help="another worktree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=150, help="submissions a round")
    parser.add_argument("--prepaid", action="store_true", help="a prepaid organisation")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(Path(args.serve), args.prepaid)

    import httpx

    roots = [HERE.parents[1], *(Path(p).resolve() for p in args.against)]
    platforms = []
    for root in roots:
        argv_ = [str(root / ".venv/bin/python"), str(HERE), "--serve", str(root)]
        proc = subprocess.Popen(
            argv_ + (["--prepaid"] if args.prepaid else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            print(f"{root}: the platform did not start", file=sys.stderr)
            return 1
        where = json.loads(line)
        client = httpx.Client(
            base_url=where["url"],
            headers={"Authorization": f"Bearer {where['token']}"},
            timeout=30,
        )
        platforms.append((root.name, proc, client, where["pid"]))
    per_job: dict[str, list[float]] = {name: [] for name, *_ in platforms}
    try:
        for round_ in range(args.rounds + 1):  # the first warms each up, uncounted
            for name, _, client, pid in platforms if round_ % 2 else platforms[::-1]:
                before = cpu_s(pid)
                t0 = time.monotonic()
                for _ in range(args.jobs):
                    answer = client.post("/api/v1/jobs", json=SPEC)
                    answer.raise_for_status()
                wall = time.monotonic() - t0
                ms = (cpu_s(pid) - before) * 1000 / args.jobs
                if round_:
                    per_job[name].append(ms)
                print(f"round {round_} {name:<14} {ms:6.2f} ms CPU/job  {wall:5.2f} s wall")
    finally:
        for _, proc, client, _ in platforms:
            client.close()
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
    print(f"web CPU a submission, median of {args.rounds} rounds of {args.jobs}:")
    first = per_job[platforms[0][0]]
    figures: dict[str, float] = {}
    for name, values in per_job.items():
        figures[name] = round(statistics.median(values), 3)
        line = f"  {name:<14} {figures[name]:6.2f} ms"
        if values is not first:  # each round's own ratio: the machine's drift cancels
            ratio = statistics.median(a / b for a, b in zip(first, values, strict=True))
            figures[f"{platforms[0][0]} / {name}"] = round(ratio, 3)
            line += f"  ({platforms[0][0]} / {name}, median of the rounds' ratios: {ratio:.3f})"
        print(line)
    print(json.dumps({"bench": "submit_cpu", **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
