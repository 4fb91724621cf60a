"""Raft commit throughput: commands committed per second by three controller replicas.

Starts three `spurctld` replicas on loopback (a Raft group, each its own process and
fsynced journal, as bench/failover.py does), registers one node, then for 1, 8 and 32
concurrent clients submits held jobs (`hold=True`: a submission is one committed
command, and a held job gives the scheduler nothing to do) to the leader for DURATION_S
seconds each, and counts the submissions accepted (201).

The clients are lean on purpose, so that they measure the controller and not themselves:
each thread holds one keep-alive connection (the standard library's `http.client`) and
sends one pre-encoded body again and again; the threads run in CLIENT_PROCESSES
processes, so that the clients' own Python does not cap what they can ask. The config
the bench writes lifts the per-account cap on waiting jobs (`max_submit_jobs_per_account
= 0`): the held jobs of all rows stay, and the default cap (10,000) would refuse the
last row's.

Columns: commits/s; the log entries the commands took (group commit: the commands that
arrive while a round is in flight share the next entry); the submit latency p50 and
p99; the leader's CPU time per command, and the two followers' together. The last row
is the reference without HTTP: three `Replica` objects in three processes (the same
Raft layer, journal and group commit, no controller around them) with 32 threads calling
`Replica.commit` on the leader.

    python bench/raft.py
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failover import TOKEN, Group, with_group  # noqa: E402

from scheduler.client import ControllerClient  # noqa: E402
from tests.fixtures.processes import free_port, wait_until  # noqa: E402
from tests.scheduler.core.factories import gpu_node, spec  # noqa: E402

CLIENTS = (1, 8, 32)
DURATION_S = 5.0
CLIENT_PROCESSES = 4
REFERENCE_THREADS = 32
# Appended to the config the group starts with: no cap on the held jobs piling up.
UNCAPPED = "\n[scheduler]\nmax_submit_jobs_per_account = 0\n"


def _client_process(url: str, threads: int, duration_s: float) -> tuple[int, list[float], str]:
    """Submit held jobs from `threads` threads for `duration_s`, each thread on its own
    keep-alive connection: (accepted, latencies in seconds, the first refusal if any)."""
    host, _, port = url.removeprefix("http://").partition(":")
    payload = json.dumps({"spec": spec(name="raft-bench", hold=True).to_dict()}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    counts = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []

    def loop(i: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        deadline = time.monotonic() + duration_s
        try:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                conn.request("POST", "/v1/jobs", payload, headers)
                answer = conn.getresponse()
                body = answer.read()
                if answer.status != 201:
                    errors.append(f"{answer.status}: {body[:200]!r}")
                    return
                latencies[i].append(time.perf_counter() - t0)
                counts[i] += 1
        finally:
            conn.close()

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts), [t for each in latencies for t in each], errors[0] if errors else ""


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds the process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Row:
    def __init__(self, clients: int, done: int, elapsed: float, entries: int,
                 latencies: list[float], leader_cpu_s: float,
                 followers_cpu_s: float) -> None:  # fmt: skip
        self.clients = clients
        self.done = done
        self.rate = done / elapsed
        self.entries = entries
        latencies.sort()
        self.p50_ms = 1000 * latencies[len(latencies) // 2] if latencies else 0.0
        self.p99_ms = 1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0.0
        self.leader_us = 1e6 * leader_cpu_s / done if done else 0.0
        self.followers_us = 1e6 * followers_cpu_s / done if done else 0.0


def measure(group: Group, pool: ProcessPoolExecutor, clients: int) -> Row:
    leader = group.leader()
    url = group.urls[leader]
    pids = {i: group.procs.procs[f"ctld{i}"].pid for i in range(3)}
    before = (group.info(leader) or {}).get("last_applied", 0)
    cpu_before = {i: _cpu_s(pid) for i, pid in pids.items()}
    processes = min(clients, CLIENT_PROCESSES)
    shares = [
        clients // processes + (1 if i < clients % processes else 0) for i in range(processes)
    ]
    t0 = time.monotonic()
    futures = [pool.submit(_client_process, url, share, DURATION_S) for share in shares]
    results = [f.result() for f in futures]
    elapsed = time.monotonic() - t0
    cpu = {i: _cpu_s(pid) - cpu_before[i] for i, pid in pids.items()}
    entries = (group.info(leader) or {}).get("last_applied", 0) - before
    refused = [error for _, _, error in results if error]
    if refused:
        raise RuntimeError(f"{len(refused)} client(s) refused: {refused[0]}")
    return Row(
        clients,
        sum(done for done, _, _ in results),
        elapsed,
        entries,
        [t for _, latencies, _ in results for t in latencies],
        cpu[leader],
        sum(t for i, t in cpu.items() if i != leader),
    )


# -- the reference: Replica.commit without HTTP ------------------------------------------


def _replica_process(index: int, addresses: list[str], state_dir: str, duration_s: float,
                     threads: int, out: Any, stop: Any) -> None:  # fmt: skip
    """One replica of the reference group; the leader runs the load and reports it."""
    from scheduler import config as spur_config
    from scheduler.core import commands as c
    from scheduler.ctld.replica import Replica

    replica = Replica(
        address=addresses[index],
        peers=[a for i, a in enumerate(addresses) if i != index],
        state_dir=os.path.join(state_dir, f"r{index}"),
        password="bench-secret",
        on_effects=lambda command, effects: None,
        on_leader_change=lambda leading: None,
    )
    try:
        wait_until(lambda: replica.is_ready and bool(replica.leader_address), timeout=60,
                   what="a leader")  # fmt: skip
        time.sleep(1.0)  # every replica connected
        if not replica.is_leader:
            stop.wait(120)
            return
        partitions = (c.PartitionDef(name="gpu", default=True),)
        replica.commit(c.ConfigurePartitions(uuid.uuid4().hex, time.time(), partitions))
        replica.commit(c.RegisterNode(uuid.uuid4().hex, time.time(), gpu_node("sim01")))
        settings = {"cluster": {"token": TOKEN}, "scheduler": {"max_submit_jobs_per_account": 0}}
        uncapped = spur_config.parse(settings).policy
        replica.commit(c.ConfigurePolicy(uuid.uuid4().hex, time.time(), uncapped))
        held = spec(name="raft-bench", hold=True)
        counts = [0] * threads
        latencies: list[float] = []
        deadline = time.monotonic() + duration_s

        def loop(i: int) -> None:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                replica.commit(c.SubmitJob(uuid.uuid4().hex, time.time(), held))
                latencies.append(time.perf_counter() - t0)
                counts[i] += 1

        rounds = replica._group.rounds
        workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        cpu0, t0 = time.process_time(), time.monotonic()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
        out.put((sum(counts), elapsed, replica._group.rounds - rounds, latencies, cpu))
        stop.set()
    finally:
        replica.destroy()


def reference() -> Row:
    """32 threads calling `Replica.commit` on the leader of three Replica processes."""
    context = multiprocessing.get_context("spawn")
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    out, stop = context.Queue(), context.Event()
    with tempfile.TemporaryDirectory(prefix="spur-raft-ref-") as tmp:
        procs = [
            context.Process(
                target=_replica_process,
                args=(i, addresses, tmp, DURATION_S, REFERENCE_THREADS, out, stop),
            )
            for i in range(3)
        ]
        for proc in procs:
            proc.start()
        try:
            deadline = time.monotonic() + 120
            while out.empty():
                if time.monotonic() > deadline or any(p.exitcode for p in procs):
                    raise RuntimeError("the reference group gave no result (see above)")
                time.sleep(0.1)
            done, elapsed, entries, latencies, cpu = out.get()
        finally:
            stop.set()
            for proc in procs:
                proc.join(30)
    return Row(REFERENCE_THREADS, done, elapsed, entries, latencies, cpu, 0.0)


def main() -> int:
    return with_group("spur-raft-", run)


def run(group: Group) -> int:
    group.config.write_text(group.config.read_text() + UNCAPPED)
    for i in range(3):
        group.start(i)
    wait_until(group.settled, timeout=60, what="a settled group")
    with ControllerClient(group.urls, TOKEN, timeout=10, retry_for_s=30) as admin:
        admin.register_node(gpu_node("sim01").to_dict())
    rows = []
    with ProcessPoolExecutor(CLIENT_PROCESSES) as pool:
        pool.submit(_client_process, group.urls[group.leader()], 1, 0.5).result()  # warm up
        for clients in CLIENTS:
            rows.append(measure(group, pool, clients))
    group.close()  # the reference gets the machine to itself
    ref = reference()
    print(f"Spur Raft commits: 3 spurctld replicas on loopback, held-job submissions to the "
          f"leader for {DURATION_S:.0f} s per row (keep-alive http.client clients)")  # fmt: skip
    print(f"{'clients':>8}  {'commits/s':>10}  {'commands':>9}  {'log entries':>11}  "
          f"{'cmds/entry':>10}  {'p50 ms':>7}  {'p99 ms':>7}  {'leader us/cmd':>13}  "
          f"{'followers us/cmd':>16}")  # fmt: skip
    for row in [*rows, ref]:
        per_entry = row.done / row.entries if row.entries else 0.0
        followers = f"{row.followers_us:>16.0f}" if row is not ref else f"{'-':>16}"
        print(f"{row.clients:>8}  {row.rate:>10.0f}  {row.done:>9}  {row.entries:>11}  "
              f"{per_entry:>10.1f}  {row.p50_ms:>7.1f}  {row.p99_ms:>7.1f}  "
              f"{row.leader_us:>13.0f}  {followers}")  # fmt: skip
    print(f"(last row: Replica.commit from {REFERENCE_THREADS} threads in the leader's process, "
          "no HTTP; its CPU is that whole process's)")  # fmt: skip
    figures: dict[str, object] = {"bench": "raft", "replicas": 3}
    for row in rows:
        figures[f"commits_per_s_{row.clients}"] = round(row.rate, 1)
    figures["leader_cpu_us_per_cmd_32"] = round(rows[-1].leader_us, 1)
    figures["replica_commit_per_s_32"] = round(ref.rate, 1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
