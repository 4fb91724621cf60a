"""Raft commit throughput: commands committed per second by three controller replicas.

Starts three `spurctld` replicas on loopback (a Raft group, each its own process and
fsynced journal, as bench/failover.py does), registers one node, then for 1, 8 and 32
concurrent clients submits held jobs (`hold=True`: a submission is one committed
command, and a held job gives the scheduler nothing to do) to the leader through
`ControllerClient` for DURATION_S seconds each, and counts the submissions accepted.
The clients run in CLIENT_PROCESSES processes (threads within them), so that the
clients' own Python does not cap what they can ask. Also prints how many Raft log
entries the commands took (group commit: the commands that arrive while a round is in
flight share the next entry).

    python bench/raft.py
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failover import TOKEN, Group, with_group  # noqa: E402

from scheduler.client import ControllerClient  # noqa: E402
from tests.fixtures.processes import wait_until  # noqa: E402
from tests.scheduler.core.factories import gpu_node, spec  # noqa: E402

CLIENTS = (1, 8, 32)
DURATION_S = 5.0
CLIENT_PROCESSES = 4


def _client_process(url: str, threads: int, duration_s: float) -> int:
    """Submit held jobs from `threads` threads for `duration_s`: how many were accepted."""
    body = spec(name="raft-bench", hold=True).to_dict()
    counts = [0] * threads

    def loop(i: int) -> None:
        with ControllerClient([url], TOKEN, timeout=30) as client:
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                client.submit(body)
                counts[i] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts)


def measure(group: Group, pool: ProcessPoolExecutor, clients: int) -> tuple[float, int, int]:
    """(commits/s, commands, log entries) with `clients` concurrent clients."""
    leader = group.leader()
    url = group.urls[leader]
    before = (group.info(leader) or {}).get("last_applied", 0)
    processes = min(clients, CLIENT_PROCESSES)
    shares = [
        clients // processes + (1 if i < clients % processes else 0) for i in range(processes)
    ]
    t0 = time.monotonic()
    futures = [pool.submit(_client_process, url, share, DURATION_S) for share in shares]
    done = sum(f.result() for f in futures)
    elapsed = time.monotonic() - t0
    entries = (group.info(leader) or {}).get("last_applied", 0) - before
    return done / elapsed, done, entries


def main() -> int:
    return with_group("spur-raft-", run)


def run(group: Group) -> int:
    for i in range(3):
        group.start(i)
    wait_until(group.settled, timeout=60, what="a settled group")
    with ControllerClient(group.urls, TOKEN, timeout=10, retry_for_s=30) as admin:
        admin.register_node(gpu_node("sim01").to_dict())
    rows = []
    with ProcessPoolExecutor(CLIENT_PROCESSES) as pool:
        pool.submit(_client_process, group.urls[group.leader()], 1, 0.5).result()  # warm up
        for clients in CLIENTS:
            rows.append((clients, *measure(group, pool, clients)))
    print(f"Spur Raft commits: 3 spurctld replicas on loopback, held-job submissions to the "
          f"leader for {DURATION_S:.0f} s per row")  # fmt: skip
    print(f"{'clients':>8}  {'commits/s':>10}  {'commands':>9}  {'log entries':>11}  "
          f"{'commands/entry':>14}")  # fmt: skip
    for clients, rate, done, entries in rows:
        per_entry = done / entries if entries else 0.0
        print(f"{clients:>8}  {rate:>10.0f}  {done:>9}  {entries:>11}  {per_entry:>14.1f}")
    figures: dict[str, object] = {"bench": "raft", "replicas": 3}
    for clients, rate, _, _ in rows:
        figures[f"commits_per_s_{clients}"] = round(rate, 1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
