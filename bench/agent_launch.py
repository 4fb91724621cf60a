"""How fast one agent starts a contained job, and how fast it takes one down.

One agent, in a process of its own, set up as `spurd` sets itself up: its real HTTP API
(uvicorn on loopback) in front of its real launcher, launches and signals signed with the
node's credential, a fencing lease (so every job has its lease watcher), srun and the
Slurm commands in every sandbox, its spool and config hidden; every job in its bubblewrap
sandbox as the organisation's identity (cloud tenancy when run as root, the personal
mode otherwise), with its limits, and with the device nodes of its GPUs when run as root
(fake ones, made with mknod and named by a CDI spec, as on a GPU node). 500 jobs, one at
a time, each cycling over 8 GPUs, after 10 that are not counted (the first makes the
organisation's account).

- launch: from the moment the client sends the launch request to the moment the batch
  script runs inside its sandbox (it prints bash's $EPOCHREALTIME as its first act);
- teardown: from the moment the client sends the cancel (SIGTERM) to the moment every
  process of the job is gone and its end is reported (the controller then frees the
  GPUs);
- CPU a job: what the agent's process spent (user and system, all its threads), and what
  the processes it started for the job spent (the job's supervisor, bubblewrap, the job's
  shells and `sleep`: bench/proctree.py), from /proc; as root, also all of it together
  from a cgroup of the agent's own, which counts what no process above reaps (each
  sandbox's init, whose namespaces' teardown the machine's init reaps).

    python bench/agent_launch.py [--own-dir] [--batch N]

`--own-dir`: the jobs name no directory, so that each runs in one made for it
(`jobs/<id>` in the workspace), as bench/e2e.py's jobs do; else they run in a directory
of the workspace that exists, as sbatch's from a directory there do.

`--batch N`: bench/e2e.py's jobs instead (`#!/bin/sh\ntrue`, output to /dev/null, each in
a directory made for it), sent N to a request (/v1/launches, as the Celery worker sends
a node's), each batch waited for to its last end: no latencies, only the CPU a job.

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from proctree import Cgroup, cpu_seconds  # noqa: E402

from agents.api import create_app  # noqa: E402
from agents.client import AgentClient  # noqa: E402
from agents.confinement import hidden_paths  # noqa: E402
from agents.credentials import NodeCredential  # noqa: E402
from agents.identity import Identities  # noqa: E402
from agents.launcher import Launcher  # noqa: E402
from agents.sandbox import Bubblewrap  # noqa: E402
from agents.supervisor import Lease  # noqa: E402
from scheduler.client import JobReport  # noqa: E402
from scheduler.rpc import signatures  # noqa: E402

JOBS = 500
WARM_UP = 10
GPUS = 8
TOKEN = "bench-cluster-token"
TENANT = "bench"
SCRIPT = "#!/bin/bash\necho $EPOCHREALTIME\nexec sleep 600\n"
TRUE = "#!/bin/sh\ntrue\n"  # bench/e2e.py's job (--batch)
NODE = "bench01"
LEASE_S = 3600.0  # renewed by no heartbeat here: longer than the benchmark


class Reports:
    """The agent's reporter: sends when each job's start and end were reported to the
    benchmark, in the other process."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def report(self, report: JobReport) -> None:
        with self.lock:
            self.conn.send((report.kind, report.job_id, time.time()))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def fake_gpus(where: Path) -> Path | None:
    """A CDI spec naming device nodes made here (root only: mknod)."""
    if os.geteuid() != 0:
        return None
    devices = where / "dev"
    devices.mkdir()
    devices.chmod(0o755)
    names = [f"nvidia{i}" for i in range(GPUS)] + ["nvidiactl", "nvidia-uvm"]
    for name in names:
        os.mknod(devices / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    def nodes(*names: str) -> list[dict[str, str]]:
        return [{"path": f"/dev/{n}", "hostPath": str(devices / n)} for n in names]

    spec = {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": str(i), "containerEdits": {"deviceNodes": nodes(f"nvidia{i}")}}
            for i in range(GPUS)
        ],
        "containerEdits": {"deviceNodes": nodes("nvidiactl", "nvidia-uvm")},
    }
    path = where / "nvidia-gpu.json"
    path.write_text(json.dumps(spec))
    return path


def payload(
    job_id: int, submit_dir: str, credential: bytes, script: str = SCRIPT
) -> dict[str, Any]:
    """A launch as the leader signs it (scheduler/ctld/dispatch.py); `script` TRUE: as
    bench/e2e.py submits it (its output to /dev/null)."""
    gpu = job_id % GPUS
    spec = {"script": script, "name": "bench", "tenant": TENANT, "user": "bench",
            "submit_dir": submit_dir, "gpus_per_node": 1}  # fmt: skip
    streams = {"stdout": "/dev/null", "stderr": "/dev/null"} if script == TRUE else {}
    launch: dict[str, Any] = {
        "job_id": job_id,
        "attempt": 1,
        "node": NODE,
        "cluster_name": "bench",
        "job": {
            "job_id": job_id,
            "name": "bench",
            "user": "bench",
            "tenant": TENANT,
            "nodes": [NODE],
            "allocation": {NODE: {"gpus": [gpu], "cpus": 1, "mem_mb": 4096}},
            "attempt": 1,
            "submit_time": 1700000000.0 + job_id,
            "stdout": "slurm-%j.out",
            "stderr": "",
            **streams,
            "spec": {**spec, **streams},
        },
    }
    expires = time.time() + signatures.LAUNCH_TTL_S
    fields = signatures.launch_fields(launch)
    launch["signature"] = signatures.sign(credential, "launch", fields, expires=expires)
    return launch


def cancel(job_id: int, credential: bytes) -> dict[str, Any]:
    """scancel's signal, as the leader signs it."""
    body = {"attempt": 1, "signal": int(signal.SIGTERM), "kill_after_s": None, "node": NODE}
    expires = time.time() + signatures.LAUNCH_TTL_S
    fields = signatures.signal_fields(body, job_id)
    signed = signatures.sign(credential, "signal", fields, expires=expires)
    return {"signal": int(signal.SIGTERM), "attempt": 1, "signature": signed}


def agent(conn: Connection, where: Path, cdi_spec: Path | None, key: bytes) -> None:
    """The agent, in a process of its own as in production: its launcher and its API."""
    identities = Identities() if os.geteuid() == 0 else Identities(personal=True)
    spool = where / "spool"
    spool.mkdir(mode=0o700)
    credential = NodeCredential(spool / "credential", NODE)
    credential.store(key.hex())
    config = where / "etc" / "spur.toml"
    config.parent.mkdir()
    config.write_text("")
    lease = Lease()
    lease.renew(sent_at=time.monotonic(), lease_s=LEASE_S)
    launcher = Launcher(
        node=NODE,
        spool_dir=spool,
        reporter=Reports(conn),
        work_root=where / "work",
        identities=identities,
        sandbox=Bubblewrap(hidden=hidden_paths(config_path=str(config), spool_dir=str(spool))),
        cdi_spec=cdi_spec,
        cluster_name="bench",
        lease=lease,
        credential=credential,
        controllers=["http://127.0.0.1:9"],  # srun's, never called here
    )
    identity = identities.for_job(tenant=TENANT, user="bench")
    workspace = launcher.workspaces.ensure(TENANT, identity)
    run_dir = workspace / "runs"
    run_dir.mkdir()
    os.chown(run_dir, identity.uid, identity.gid)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = create_app(launcher=launcher, token=TOKEN, credential=credential)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    gc.freeze()  # as spurd does once it is set up (agents/main.py)
    described = (
        f"sandbox {launcher.sandbox.kind}, limits {launcher.limits.kind}, identity "
        f"{identity.name} (uid {identity.uid}, {identities.mode} tenancy)"
    )
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    conn.send((url, str(workspace), str(run_dir), described))
    conn.recv()  # the benchmark is done
    launcher.kill_all()
    server.should_exit = True


def started_at(output: Path, timeout: float = 30) -> float:
    """When the script says it began (waiting on the `started` report first, so that no
    polling competes with the launch for the CPUs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = output.read_text()
        except FileNotFoundError:
            text = ""
        if text.endswith("\n"):
            return float(text.split()[0])
        time.sleep(0.001)
    raise TimeoutError(f"{output} never showed the script running")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--own-dir", action="store_true", help="jobs run in a directory made for each"
    )
    parser.add_argument(
        "--batch", type=int, default=0, help="e2e's `true` jobs, N to a launch request"
    )
    args = parser.parse_args()
    own_dir = args.own_dir or args.batch > 0
    where = Path(tempfile.mkdtemp(prefix="spur-bench-launch-", dir="/tmp"))
    where.chmod(0o711)
    key = signatures.node_key(os.urandom(32), NODE)
    ours, theirs = multiprocessing.Pipe()
    # Forked before this process starts any thread; the client stays out of the agent's
    # process (and its GIL), as the Celery workers do.
    child = multiprocessing.get_context("fork").Process(
        target=agent, args=(theirs, where, fake_gpus(where), key), daemon=True
    )
    child.start()
    assert child.pid is not None
    cgroup = Cgroup.made("spur-bench-agent")
    if cgroup is not None:
        cgroup.add(child.pid)  # before its first job: it starts its job supervisor then
    url, workspace, run_dir, described = ours.recv()
    seen: dict[tuple[str, int], float] = {}

    def reported(kind: str, job_id: int) -> float:
        while (kind, job_id) not in seen:
            if not ours.poll(30):
                raise TimeoutError(f"job {job_id} never {kind}")
            got_kind, got_id, at = ours.recv()
            seen[(got_kind, got_id)] = at
        return seen.pop((kind, job_id))

    launches: list[float] = []
    teardowns: list[float] = []
    all_before = all_after = 0.0
    cpu_before: tuple[float, float] | None = None
    counted = JOBS
    try:
        with AgentClient(url, TOKEN, timeout=30) as client:
            for first in range(1, WARM_UP + JOBS + 1, args.batch) if args.batch else ():
                if first > WARM_UP and cpu_before is None:
                    cpu_before = cpu_seconds({"agent": child.pid})["agent"]
                    all_before = cgroup.cpu_seconds() if cgroup is not None else 0.0
                    counted = WARM_UP + JOBS + 1 - first  # the warm-up's last batch's
                ids = range(first, min(first + args.batch, WARM_UP + JOBS + 1))
                client.launch_all([payload(i, "", key, TRUE) for i in ids])
                for job_id in ids:
                    reported("finished", job_id)
            for job_id in range(1, WARM_UP + JOBS + 1) if not args.batch else ():
                if job_id == WARM_UP + 1:
                    cpu_before = cpu_seconds({"agent": child.pid})["agent"]
                    all_before = cgroup.cpu_seconds() if cgroup is not None else 0.0
                launch = payload(job_id, "" if own_dir else run_dir, key)
                sent = time.time()
                client.launch(launch)
                reported("started", job_id)
                where_out = Path(workspace) / "jobs" / str(job_id) if own_dir else Path(run_dir)
                running = started_at(where_out / f"slurm-{job_id}.out")
                cancelled = time.time()
                client.signal(job_id, **cancel(job_id, key))
                ended = reported("finished", job_id)
                if job_id > WARM_UP:
                    launches.append((running - sent) * 1000)
                    teardowns.append((ended - cancelled) * 1000)
            cpu_after = cpu_seconds({"agent": child.pid})["agent"]
            # The last job's sandbox is torn down after its end is reported: counted
            # once its init is gone (as each job before it was, by the next one's end).
            time.sleep(0.2)
            all_after = cgroup.cpu_seconds() if cgroup is not None else 0.0
    finally:
        ours.send("stop")
        child.join(10)
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(where, ignore_errors=True)

    assert cpu_before is not None
    figures: dict[str, Any] = {"bench": "agent_launch", "batch": args.batch or None}
    for label, values in (("launch", launches), ("teardown", teardowns)):
        if values:
            figures[f"{label}_p50_ms"] = round(percentile(values, 0.5), 2)
            figures[f"{label}_p99_ms"] = round(percentile(values, 0.99), 2)
    figures |= {
        "agent_cpu_ms_per_job": round((cpu_after[0] - cpu_before[0]) * 1000 / counted, 2),
        "job_processes_cpu_ms_per_job": round((cpu_after[1] - cpu_before[1]) * 1000 / counted, 2),
        "all_cpu_ms_per_job": (
            round((all_after - all_before) * 1000 / counted, 2) if cgroup is not None else None
        ),
        "run_dir": "own" if own_dir else "submit",
    }
    devices = "fake GPU device nodes" if os.geteuid() == 0 else "no device nodes (not root)"
    print(
        f"spurd: {counted} jobs, "
        + (f"`true`, {args.batch} a request" if args.batch else "one at a time")
        + f", through its HTTP API; {described}, {devices}; "
        f"each in {'a directory made for it' if own_dir else 'its submit directory'}; "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'figure (ms)':<34}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    for label, values in (
        ("launch: request -> script runs", launches),
        ("teardown: SIGTERM -> all gone", teardowns),
    ):
        if not values:
            continue
        row = [percentile(values, q) for q in (0.5, 0.9, 0.99)] + [max(values)]
        print(f"{label:<34}" + "".join(f"{v:>9.2f}" for v in row))
    for label, key in (
        ("CPU a job (ms): the agent", "agent_cpu_ms_per_job"),
        ("  the processes it started", "job_processes_cpu_ms_per_job"),
        ("  all in its cgroup (root only)", "all_cpu_ms_per_job"),
    ):
        if figures[key] is not None:
            print(f"{label:<34}{figures[key]:>9.2f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
