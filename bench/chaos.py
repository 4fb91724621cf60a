"""Chaos: faults in every process while jobs run; then an audit of what happened.

Starts, as real processes on loopback: three controller replicas (one Raft group), two
Celery workers and three agents with 8 simulated MI300X each. Submits short one-GPU jobs
through the controller's RPC while a chaos loop, every few seconds, picks a controller
(the leader included), a worker or an agent at random and either kills it (`-9`) and
starts it again, or pauses it (SIGSTOP) for longer than the node timeout and continues
it. Then it waits for every job to end and audits:

- acknowledged: submissions the controller answered with a job;
- terminal_once: acknowledged jobs that reached one terminal state, with their script
  run to its end at most once (COMPLETED exactly once);
- lost: acknowledged jobs the controller does not know;
- false_failures: jobs that did not end COMPLETED although their last run's script
  exited 0 and their node's agent suffered no fault from that run's start to its end
  (plus the node timeout);
- double_booked: pairs of runs that used one GPU at the same instant, from the jobs'
  own records (each run writes its start, a tick every 100 ms and its end into its
  workspace: a killed run's last tick bounds when it stopped);
- stuck: acknowledged jobs not ended when the audit gives up.

Goal: every figure zero, and terminal_once == acknowledged.

    python bench/chaos.py                # 1,000 jobs (several minutes)
    python bench/chaos.py --jobs 60 --faults 6     # what the test suite runs

Last line: {"bench": "chaos", "acknowledged": .., "terminal_once": .., "lost": ..,
"false_failures": .., "double_booked": .., "stuck": ..}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.client import ControllerClient  # noqa: E402
from scheduler.core import contract  # noqa: E402
from scheduler.rpc.errors import RpcError  # noqa: E402
from tests.fixtures.processes import BIN, free_port  # noqa: E402

REPLICAS = 3
WORKERS = 2
AGENTS = 3
GPUS_PER_NODE = 8
TENANT = "demo"  # seed_demo's organisation: the history mirrors its jobs
TERMINAL = {state.value for state in contract.TERMINAL}
NODE_TIMEOUT_S = 6.0
TICK_S = 0.1

# Each run records itself in the workspace: "start <t> <node> <gpus>", a tick every
# 100 ms, "end <t>" once the work is done (the script then exits 0).
SCRIPT = """#!/bin/bash
rec="$SPUR_CHAOS_RECORDS/$SLURM_JOB_ID.$SLURM_RESTART_COUNT"
echo "start $EPOCHREALTIME $SLURMD_NODENAME $SLURM_JOB_GPUS" >> "$rec"
for _ in $(seq {ticks}); do sleep {tick}; echo "tick $EPOCHREALTIME" >> "$rec"; done
echo "end $EPOCHREALTIME" >> "$rec"
"""


@dataclass
class Fault:
    target: str
    kind: str  # kill | pause
    at: float
    until: float


@dataclass
class Cluster:
    root: Path
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    http: list[int] = field(default_factory=lambda: [free_port() for _ in range(REPLICAS)])
    raft: list[int] = field(default_factory=lambda: [free_port() for _ in range(REPLICAS)])
    agent_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(AGENTS)])
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.http]

    @property
    def work_root(self) -> Path:
        return self.root / "work"

    @property
    def records(self) -> Path:
        return self.work_root / TENANT / "records"

    def prepare(self) -> None:
        self.root.chmod(0o711)  # the tenant's account passes through to its workspace
        (self.root / "logs").mkdir()
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "spurcloud.settings",
            "DATABASE_URL": f"sqlite:///{self.root / 'web.sqlite3'}",
            "CELERY_BROKER_URL": "filesystem://",
            "CELERY_BROKER_FOLDER": str(self.root / "broker"),
            "SECRET_KEY": secrets.token_urlsafe(32),
            "DEBUG": "false",
            "SPUR_CLUSTER_TOKEN": self.token,
            "SPUR_CONTROLLER_URLS": ",".join(self.urls),
            "SPUR_WORK_ROOT": str(self.work_root),
            "SPUR_RAFT_PASSWORD": secrets.token_hex(16),
            "SPUR_SIGNING_KEY": secrets.token_hex(32),
        }
        controllers = ", ".join(f'"{u}"' for u in self.urls)
        personal = "" if os.geteuid() == 0 else "personal = true\n"
        (self.root / "spur.toml").write_text(
            f"""
[cluster]
name = "chaos"
token = "{self.token}"

[controller]
broker_url = "filesystem://"
broker_folder = "{self.root / "broker"}"
node_timeout_s = {NODE_TIMEOUT_S}

[[partitions]]
name = "gpu"
default = true

[agent]
controllers = [{controllers}]
work_root = "{self.work_root}"
heartbeat_interval_s = 1.0
{personal}"""
        )
        for command in (["migrate", "--noinput"], ["seed_demo"]):
            subprocess.run(
                [str(BIN / "spurcloud"), "manage", *command],
                env=self.env,
                check=True,
                capture_output=True,
            )

    def argv(self, name: str) -> list[str]:
        config = str(self.root / "spur.toml")
        kind, index = name[:-1], int(name[-1])
        if kind == "ctld":
            peers = ",".join(f"127.0.0.1:{p}" for j, p in enumerate(self.raft) if j != index)
            return [str(BIN / "spurctld"), "--config", config,
                    "--listen", f"127.0.0.1:{self.http[index]}",
                    "--raft-address", f"127.0.0.1:{self.raft[index]}",
                    "--raft-peers", peers,
                    "--state-dir", str(self.root / name)]  # fmt: skip
        if kind == "worker":
            return [str(BIN / "celery"), "-A", "spurcloud", "worker", "--pool", "threads",
                    "--concurrency", "8", "--loglevel", "INFO", "--without-gossip",
                    "--without-mingle", "-n", f"{name}@%h"]  # fmt: skip
        return [str(BIN / "spurd"), "--config", config, "--name", f"node{index}",
                "--listen", f"127.0.0.1:{self.agent_ports[index]}",
                "--devices", f"sim:mi300x-{GPUS_PER_NODE}",
                "--spool-dir", str(self.root / "spool" / name)]  # fmt: skip

    def start(self, name: str) -> None:
        log = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            self.argv(name), stdout=log, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True,
        )  # fmt: skip

    def print_logs(self, lines: int = 30) -> None:
        """The last lines of each process's log, to stderr."""
        for path in sorted((self.root / "logs").glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            print(f"--- {path.name}", *tail, sep="\n", file=sys.stderr)

    def signal(self, name: str, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[name].pid, sig)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        self.procs[name].wait()

    def stop_all(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                self.signal(name, signal.SIGCONT)
                self.signal(name, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()

    def names(self) -> list[str]:
        return (
            [f"ctld{i}" for i in range(REPLICAS)]
            + [f"worker{i}" for i in range(WORKERS)]
            + [f"agent{i}" for i in range(AGENTS)]
        )


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except RpcError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def chaos(cluster: Cluster, faults: int, stop: threading.Event, log: list[Fault]) -> None:
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "1")))
    for _ in range(faults):
        if stop.wait(rng.uniform(2.0, 4.0)):
            return
        target = rng.choice(cluster.names())
        kind = rng.choice(["kill", "pause"])
        at = time.time()
        if kind == "kill":
            cluster.kill(target)
            time.sleep(rng.uniform(0.5, 2.0))
            cluster.start(target)
        else:
            cluster.signal(target, signal.SIGSTOP)
            time.sleep(NODE_TIMEOUT_S + rng.uniform(1.0, 3.0))
            cluster.signal(target, signal.SIGCONT)
        log.append(Fault(target, kind, at, time.time()))
        print(f"  fault: {kind:<5} {target:<8} {time.time() - at:5.1f} s", flush=True)


def submit_all(
    client: ControllerClient, jobs: int, script: str, acked: dict[int, int], interval: float
) -> None:
    spec = {"script": script, "name": "chaos", "tenant": TENANT, "user": "demo",
            "gpus_per_node": 1, "stdout": "/dev/null"}  # fmt: skip
    start = time.monotonic()
    for i in range(jobs):
        time.sleep(max(0.0, start + i * interval - time.monotonic()))
        for _ in range(100):
            try:
                job = client.submit(spec, idempotency_key=f"chaos-{i}")
                acked[i] = int(job["job_id"])
                break
            except RpcError:
                time.sleep(0.2)  # no leader right now: a client retries, same key


def read_runs(records: Path) -> dict[tuple[int, int], dict[str, Any]]:
    runs: dict[tuple[int, int], dict[str, Any]] = {}
    for path in records.glob("*.*"):
        job_id, restart = (int(x) for x in path.name.split("."))
        lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
        starts = [line for line in lines if line[0] == "start"]
        if not starts:
            continue
        start = starts[0]
        times = [float(line[1]) for line in lines if len(line) > 1]
        runs[(job_id, restart)] = {
            "start": float(start[1]),
            "last": max(times),
            "node": start[2],
            "gpus": start[3].split(",") if len(start) > 3 else [],
            "ended": any(line[0] == "end" for line in lines),
            "starts": len(starts),
        }
    return runs


def read_history(path: Path, ids: list[int]) -> dict[int, dict[str, Any]]:
    """The web's history of these jobs (what sacct shows), mirrored from the events."""
    import sqlite3

    found: dict[int, dict[str, Any]] = {}
    with contextlib.closing(sqlite3.connect(path)) as db:
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = db.execute(
                f"SELECT job_id, state, reason FROM jobs_jobrecord WHERE job_id IN ({marks})",
                chunk,
            )
            for job_id, state, reason in rows:
                found[job_id] = {"job_id": job_id, "state": state, "reason": reason}
    return found


def audit(
    cluster: Cluster,
    client: ControllerClient,
    acked: dict[int, int],
    faults: list[Fault],
    settle_s: float,
) -> dict[str, Any]:
    ids = sorted(set(acked.values()))
    deadline = time.monotonic() + settle_s
    jobs: dict[int, dict[str, Any]] = {}
    while True:
        try:
            jobs = {j["job_id"]: j for j in client.jobs(ids=ids)}
        except RpcError:
            time.sleep(0.5)
            continue
        if all(jobs.get(i, {}).get("state") in TERMINAL for i in ids if i in jobs):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # The controller forgets ended jobs after a while (MinJobAge); the history keeps them.
    missing = [i for i in ids if i not in jobs]
    if missing:
        jobs.update(read_history(cluster.root / "web.sqlite3", missing))
    runs = read_runs(cluster.records)
    by_job: dict[int, list[dict[str, Any]]] = {}
    for (job_id, restart), run in sorted(runs.items()):
        by_job.setdefault(job_id, []).append({**run, "restart": restart})

    lost = [i for i in ids if i not in jobs]
    stuck = [i for i in ids if i in jobs and jobs[i]["state"] not in TERMINAL]
    terminal_once = 0
    false_failures = []
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None or job["state"] not in TERMINAL:
            continue
        mine = by_job.get(job_id, [])
        completed_runs = sum(1 for r in mine if r["ended"])
        if job["state"] == "COMPLETED":
            terminal_once += completed_runs == 1 and all(r["starts"] == 1 for r in mine)
            continue
        terminal_once += 1  # one terminal state; a run that had ended counts below
        last = mine[-1] if mine else None
        if last is not None and last["ended"]:
            agent = f"agent{int(last['node'].removeprefix('node'))}"
            window = (last["start"], last["last"] + NODE_TIMEOUT_S)
            excused = any(
                f.target == agent and f.at < window[1] and f.until > window[0] for f in faults
            )
            if not excused:
                false_failures.append(job_id)

    doubles: list[dict[str, Any]] = []
    by_gpu: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for (job_id, _), run in runs.items():
        for gpu in run["gpus"]:
            by_gpu.setdefault((run["node"], gpu), []).append((run["start"], run["last"], job_id))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for i, (start, end, job_id) in enumerate(spans):
            # Each run that began earlier on this GPU and had not stopped yet.
            for s, e, j in spans[:i]:
                if j != job_id and s <= start < e:
                    doubles.append({"gpu": gpu, "first": [j, s, e], "second": [job_id, start, end]})
    states: dict[str, int] = {}
    for job in jobs.values():
        states[job["state"]] = states.get(job["state"], 0) + 1
    return {
        "acknowledged": len(ids),
        "terminal_once": terminal_once,
        "lost": len(lost),
        "false_failures": len(false_failures),
        "double_booked": len(doubles),
        "stuck": len(stuck),
        "_states": states,
        "_false_failure_ids": false_failures[:20],
        "_stuck_ids": stuck[:20],
        "_runs": len(runs),
        "_doubles": doubles,
        "_false_failures": [{**jobs[i], "runs": by_job.get(i, [])} for i in false_failures],
        "_fault_log": [vars(f) for f in faults],
    }


def run(jobs: int, faults: int, *, ticks: int = 5, keep: bool = False) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="spur-chaos-", dir="/tmp"))
    cluster = Cluster(root)
    cluster.prepare()
    script = SCRIPT.format(ticks=ticks, tick=TICK_S)
    client = ControllerClient(cluster.urls, cluster.token, timeout=5, retry_for_s=10)
    fault_log: list[Fault] = []
    stop = threading.Event()
    try:
        for name in cluster.names():
            cluster.start(name)
        try:
            wait_for(lambda: client.ping()["leader"] is not None, 60, "a leader")
            wait_for(
                lambda: sum(n["state"] != "down" for n in client.nodes()) == AGENTS,
                60,
                "the nodes",
            )
        except RuntimeError:
            cluster.print_logs()  # why it did not come up, before the folder goes
            raise
        cluster.records.mkdir(parents=True, exist_ok=True)
        cluster.records.chmod(0o777)  # the tenant's account writes its records there
        script = script.replace("$SPUR_CHAOS_RECORDS", str(cluster.records))
        acked: dict[int, int] = {}
        t0 = time.time()
        loop = threading.Thread(target=chaos, args=(cluster, faults, stop, fault_log))
        loop.start()
        # Spread over the chaos (a fault every ~8 s, wait and action together).
        submit_all(client, jobs, script, acked, interval=faults * 8.0 / jobs)
        loop.join()
        figures = audit(cluster, client, acked, fault_log, settle_s=120 + jobs * 0.2)
        figures["_seconds"] = round(time.time() - t0, 1)
        figures["_faults"] = len(fault_log)
        if keep:
            (root / "audit.json").write_text(json.dumps(figures, indent=1, default=str))
        return figures
    finally:
        stop.set()
        cluster.stop_all()
        client.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help="keep the logs and records")
    args = parser.parse_args(argv)
    print(
        f"chaos: {REPLICAS} controllers, {WORKERS} workers, {AGENTS} agents x {GPUS_PER_NODE} "
        f"GPUs; {args.jobs} one-GPU jobs; {args.faults} faults (kill -9 or pause)",
        flush=True,
    )
    figures = run(args.jobs, args.faults, keep=args.keep)
    print(f"{'figure':<22}{'value':>10}")
    for key, value in figures.items():
        if not key.startswith("_"):
            print(f"{key:<22}{value:>10}")
    print(f"{'runs recorded':<22}{figures['_runs']:>10}")
    print(f"{'final states':<22}{json.dumps(figures['_states']):>10}")
    print(f"{'seconds':<22}{figures['_seconds']:>10}")
    public = {"bench": "chaos", **{k: v for k, v in figures.items() if not k.startswith("_")}}
    print(json.dumps(public))
    ok = public["terminal_once"] == public["acknowledged"] and not any(
        public[k] for k in ("lost", "false_failures", "double_booked", "stuck")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
