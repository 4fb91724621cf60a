"""How fast one agent starts a contained job, and how fast it takes one down.

One agent, in a process of its own: its real HTTP API (uvicorn on loopback) in front of
its real launcher, every job in its bubblewrap sandbox as the organisation's identity (cloud
tenancy when run as root, the personal mode otherwise), with its limits, and with the
device nodes of its GPUs when run as root (fake ones, made with mknod and named by a CDI
spec, as on a GPU node). 500 jobs, one at a time, each cycling over 8 GPUs, after 10
that are not counted (the first makes the organisation's account).

- launch: from the moment the client sends the launch request to the moment the batch
  script runs inside its sandbox (it prints bash's $EPOCHREALTIME as its first act);
- teardown: from the moment the client sends the cancel (SIGTERM) to the moment every
  process of the job is gone and its end is reported (the controller then frees the
  GPUs).

    python bench/agent_launch.py

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

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

from agents.api import create_app  # noqa: E402
from agents.client import AgentClient  # noqa: E402
from agents.identity import Identities  # noqa: E402
from agents.launcher import Launcher  # noqa: E402
from scheduler.client import JobReport  # noqa: E402

JOBS = 500
WARM_UP = 10
GPUS = 8
TOKEN = "bench-cluster-token"
TENANT = "bench"
SCRIPT = "#!/bin/bash\necho $EPOCHREALTIME\nexec sleep 600\n"


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


def payload(job_id: int, submit_dir: str) -> dict[str, Any]:
    gpu = job_id % GPUS
    spec = {"script": SCRIPT, "name": "bench", "tenant": TENANT, "user": "bench",
            "submit_dir": submit_dir, "gpus_per_node": 1}  # fmt: skip
    return {
        "job_id": job_id,
        "attempt": 1,
        "node": "bench01",
        "cluster_name": "bench",
        "job": {
            "job_id": job_id,
            "name": "bench",
            "user": "bench",
            "tenant": TENANT,
            "nodes": ["bench01"],
            "allocation": {"bench01": {"gpus": [gpu], "cpus": 1, "mem_mb": 4096}},
            "attempt": 1,
            "submit_time": 1700000000.0 + job_id,
            "stdout": "slurm-%j.out",
            "stderr": "",
            "spec": spec,
        },
    }


def agent(conn: Connection, where: Path, cdi_spec: Path | None) -> None:
    """The agent, in a process of its own as in production: its launcher and its API."""
    identities = Identities() if os.geteuid() == 0 else Identities(personal=True)
    launcher = Launcher(
        node="bench01",
        spool_dir=where / "spool",
        reporter=Reports(conn),
        work_root=where / "work",
        identities=identities,
        cdi_spec=cdi_spec,
        cluster_name="bench",
    )
    identity = identities.for_job(tenant=TENANT, user="bench")
    run_dir = launcher.workspaces.ensure(TENANT, identity) / "runs"
    run_dir.mkdir()
    os.chown(run_dir, identity.uid, identity.gid)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(launcher=launcher, token=TOKEN), log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    described = (
        f"sandbox {launcher.sandbox.kind}, limits {launcher.limits.kind}, identity "
        f"{identity.name} (uid {identity.uid}, {identities.mode} tenancy)"
    )
    conn.send((f"http://127.0.0.1:{sock.getsockname()[1]}", str(run_dir), described))
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
    where = Path(tempfile.mkdtemp(prefix="spur-bench-launch-", dir="/tmp"))
    where.chmod(0o711)
    ours, theirs = multiprocessing.Pipe()
    # Forked before this process starts any thread; the client stays out of the agent's
    # process (and its GIL), as the Celery workers do.
    child = multiprocessing.get_context("fork").Process(
        target=agent, args=(theirs, where, fake_gpus(where)), daemon=True
    )
    child.start()
    url, run_dir, described = ours.recv()
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
    try:
        with AgentClient(url, TOKEN, timeout=30) as client:
            for job_id in range(1, WARM_UP + JOBS + 1):
                sent = time.time()
                client.launch(payload(job_id, run_dir))
                reported("started", job_id)
                running = started_at(Path(run_dir) / f"slurm-{job_id}.out")
                cancelled = time.time()
                client.signal(job_id, attempt=1, signal=int(signal.SIGTERM))
                ended = reported("finished", job_id)
                if job_id > WARM_UP:
                    launches.append((running - sent) * 1000)
                    teardowns.append((ended - cancelled) * 1000)
    finally:
        ours.send("stop")
        child.join(10)
        shutil.rmtree(where, ignore_errors=True)

    figures = {
        "bench": "agent_launch",
        "launch_p50_ms": round(percentile(launches, 0.5), 2),
        "launch_p99_ms": round(percentile(launches, 0.99), 2),
        "teardown_p50_ms": round(percentile(teardowns, 0.5), 2),
        "teardown_p99_ms": round(percentile(teardowns, 0.99), 2),
    }
    devices = "fake GPU device nodes" if os.geteuid() == 0 else "no device nodes (not root)"
    print(
        f"spurd: {JOBS} jobs, one at a time, through its HTTP API; {described}, {devices}; "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'figure (ms)':<34}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    for label, values in (
        ("launch: request -> script runs", launches),
        ("teardown: SIGTERM -> all gone", teardowns),
    ):
        row = [percentile(values, q) for q in (0.5, 0.9, 0.99)] + [max(values)]
        print(f"{label:<34}" + "".join(f"{v:>9.2f}" for v in row))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
