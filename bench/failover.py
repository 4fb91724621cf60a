"""Controller failover: how long writes stop when the Raft leader dies.

Starts three `spurctld` replicas on loopback (a Raft group, each its own process and
journal), then, 20 times: finds the leader, kills it with SIGKILL, and submits a job
through `ControllerClient` (knowing all three URLs, retrying while none accepts), timing
from the kill to the accepted submit; then restarts the killed replica and waits until it
has caught up before the next kill. Prints a table and, last, one JSON line.

    python bench/failover.py
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.client import ControllerClient  # noqa: E402
from tests.fixtures.controller import write_controller_config  # noqa: E402
from tests.fixtures.processes import BIN, Processes, free_port, wait_until  # noqa: E402
from tests.scheduler.core.factories import gpu_node, spec  # noqa: E402

KILLS = 20
REPLICAS = 3
TOKEN = "bench-failover-token"
ENV = {"SPUR_RAFT_PASSWORD": "bench-secret", "SPUR_SIGNING_KEY": "bench-key"}


class Group:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.http = [free_port() for _ in range(REPLICAS)]
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(REPLICAS)]
        self.config = tmp / "spur.toml"
        write_controller_config(
            self.config, token=TOKEN, http_port=self.http[0],
            raft_port=int(self.raft[0].rsplit(":", 1)[1]), state_dir=tmp / "x",
            broker_url="filesystem://", broker_folder=tmp / "broker",
        )  # fmt: skip
        self.procs = Processes(tmp / "logs")
        self.urls = [f"http://127.0.0.1:{p}" for p in self.http]
        self.probes = [ControllerClient([u], TOKEN, timeout=2) for u in self.urls]

    def start(self, i: int) -> None:
        self.procs.start(
            f"ctld{i}",
            [
                str(BIN / "spurctld"), "--config", str(self.config),
                "--listen", f"127.0.0.1:{self.http[i]}", "--raft-address", self.raft[i],
                "--raft-peers", ",".join(r for j, r in enumerate(self.raft) if j != i),
                "--state-dir", str(self.tmp / f"ctld{i}"), "--log-level", "WARNING",
            ],
            env=ENV,
        )  # fmt: skip

    def info(self, i: int) -> dict[str, Any] | None:
        try:
            replica: dict[str, Any] = self.probes[i].call("GET", "/v1/raft")["replica"]
            return replica
        except Exception:
            return None

    def leader(self) -> int:
        for i in range(REPLICAS):
            info = self.info(i)
            if info is not None and info["role"] == "leader":
                return i
        return -1

    def settled(self) -> bool:
        """One leader, every replica connected to the others and applied up to its commit."""
        infos = [self.info(i) for i in range(REPLICAS)]
        if any(i is None for i in infos):
            return False
        roles = sorted(i["role"] for i in infos if i is not None)
        if roles != ["follower", "follower", "leader"]:
            return False
        commits = {i["last_applied"] for i in infos if i is not None}
        return len(commits) == 1 and all(
            len(i["connected"]) == REPLICAS - 1 for i in infos if i is not None
        )

    def close(self) -> None:
        for p in self.probes:
            p.close()
        self.procs.stop_all()


def with_group(prefix: str, run: Callable[[Group], int]) -> int:
    """`run` on a group in a directory of its own, its replicas' logs printed if it fails
    (bench/raft.py too)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        group = Group(Path(tmp))
        try:
            return run(group)
        except Exception:
            print(group.procs.logs(), file=sys.stderr)
            raise
        finally:
            group.close()


def main() -> int:
    return with_group("spur-failover-", run)


def run(group: Group) -> int:
    for i in range(REPLICAS):
        group.start(i)
    wait_until(group.settled, timeout=60, what="a settled group")
    writer = ControllerClient(group.urls, TOKEN, timeout=5, retry_for_s=30)
    writer.register_node(gpu_node("sim01").to_dict())
    rows: list[tuple[int, int, int, int, float]] = []
    for kill in range(1, KILLS + 1):
        wait_until(group.settled, timeout=60, what="a settled group")
        writer.submit(spec(name=f"warm-{kill}").to_dict())  # a live connection, as in use
        old = group.leader()
        term_before = (group.info(old) or {}).get("term", 0)
        group.procs.procs[f"ctld{old}"].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        job = writer.submit(spec(name=f"after-kill-{kill}").to_dict())
        elapsed = time.monotonic() - killed_at
        group.procs.stop(f"ctld{old}", signal.SIGKILL)  # reap it
        new = group.leader()
        terms = (group.info(new) or {}).get("term", 0) - term_before  # 1: one clean election
        rows.append((kill, old, new, terms, elapsed))
        print(f"kill {kill:2d}: replica {old} killed, replica {new} leads, "
              f"job {job['job_id']} accepted after {elapsed:.3f} s", file=sys.stderr)  # fmt: skip
        group.start(old)
    writer.close()
    wait_until(group.settled, timeout=60, what="a settled group")

    times = [r[4] for r in rows]
    figures = {
        "bench": "failover",
        "kills": len(times),
        "p50_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
    }
    print(f"Spur controller failover: {REPLICAS} spurctld replicas on loopback, "
          f"{len(times)} leader kills (SIGKILL)")  # fmt: skip
    head = f"{'kill':>4}  {'killed':>6}  {'new leader':>10}  {'terms':>5}"
    print(f"{head}  {'kill -> accepted write (s)':>26}")
    for kill, old, new, terms, elapsed in rows:
        print(f"{kill:>4}  {old:>6}  {new:>10}  {terms:>5}  {elapsed:>26.3f}")
    pad = f"{'':>4}  {'':>6}  {'':>10}"
    print(f"{pad}  {'p50':>5}  {figures['p50_s']:>26.3f}")
    print(f"{pad}  {'mean':>5}  {statistics.mean(times):>26.3f}")
    print(f"{pad}  {'max':>5}  {figures['max_s']:>26.3f}")
    print("terms: how far the term moved (1: one election; more: split votes, each")
    print("waiting a full election timeout)")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
