"""How long SSH into a running job takes: a login, and a command run in the job's sandbox.

One agent's launcher and SSH server (agents/ssh.py) in a process of their own, running
one job that carries the client's key, every shell in its bubblewrap sandbox as the
organisation's identity (cloud tenancy as root, the personal mode otherwise). A real SSH
client (asyncssh's) on loopback measures, after 5 of each that are not counted:

- login: a new connection, key exchange and public-key login, until it is ready;
- command: `true` in a new session of an open connection, from the request to its exit
  status (a sandbox started and taken down each time);
- login + command: both, as `ssh job-N@node true` pays them;

and SFTP's throughput (OpenSSH's sftp-server in the job's sandbox, agents/ssh_transfer.py):
a 64 MiB file uploaded into the job's workspace and downloaded back, over one open
connection, MB/s (10^6 bytes a second) of the best of 3 runs each, after one of each
that is not counted (the workspace is on this machine's disk, through its page cache).

    python bench/ssh.py

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import asyncssh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.identity import Identities  # noqa: E402
from agents.launcher import Launcher, LaunchRequest  # noqa: E402
from agents.ssh import SshService, public_line  # noqa: E402

RUNS = 40
WARM_UP = 5
JOB = 7
TRANSFER_MIB = 64
TRANSFER_RUNS = 3


class NoReports:
    def report(self, report: Any) -> None:
        pass


def payload(key_line: str) -> dict[str, Any]:
    spec = {"script": "#!/bin/sh\nexec sleep 3600\n", "tenant": "bench", "user": "bench",
            "ssh_keys": [key_line]}  # fmt: skip
    allocation = {"sim01": {"gpus": [], "cpus": 2, "mem_mb": 1024}}
    job = {"job_id": JOB, "attempt": 1, "nodes": ["sim01"], "tenant": "bench", "user": "bench",
           "allocation": allocation, "spec": spec}  # fmt: skip
    return {"job_id": JOB, "attempt": 1, "node": "sim01", "cluster_name": "bench", "job": job}


def serve(root: Path, key_line: str, conn: Connection) -> None:
    work = root / "work"
    launcher = Launcher(node="sim01", spool_dir=root / "spool", reporter=NoReports(),
                        work_root=work, identities=Identities(personal=not _root()))  # fmt: skip
    launcher.launch(LaunchRequest.from_payload(payload(key_line)))
    service = SshService(launcher, listen="127.0.0.1:0", host_key_dir=root)
    service.start()
    conn.send(service.port)
    conn.recv()  # until the benchmark is done
    service.stop()
    launcher.kill_all()


def _root() -> bool:
    return os.geteuid() == 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def measure(port: int, key: asyncssh.SSHKey) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"login": [], "command": [], "login + command": []}

    def connect() -> Any:
        return asyncssh.connect("127.0.0.1", port, username=f"job-{JOB}", client_keys=[key],
                                known_hosts=None, agent_path=None)  # fmt: skip

    for i in range(WARM_UP + RUNS):
        begun = time.perf_counter()
        async with connect() as conn:
            logged_in = time.perf_counter()
            result = await conn.run("true")
            done = time.perf_counter()
            assert result.exit_status == 0, result
            ran = time.perf_counter()
            again = await conn.run("true")
            assert again.exit_status == 0
            command = time.perf_counter() - ran
        if i >= WARM_UP:
            found["login"].append(logged_in - begun)
            found["command"].append(command)
            found["login + command"].append(done - begun)
    return found


async def measure_sftp(port: int, key: asyncssh.SSHKey, local: Path) -> dict[str, float]:
    """MB/s of the best upload and download of a TRANSFER_MIB file, after one of each."""
    size = TRANSFER_MIB * 1024 * 1024
    source, back = local / "upload.bin", local / "download.bin"
    with source.open("wb") as out:
        out.write(os.urandom(size))  # incompressible, as model weights and datasets are
    best = {"upload": 0.0, "download": 0.0}
    connect = asyncssh.connect("127.0.0.1", port, username=f"job-{JOB}", client_keys=[key],
                               known_hosts=None, agent_path=None)  # fmt: skip
    async with connect as conn, conn.start_sftp_client() as sftp:
        for i in range(1 + TRANSFER_RUNS):
            begun = time.perf_counter()
            await sftp.put(str(source), "bench.bin")
            uploaded = time.perf_counter()
            await sftp.get("bench.bin", str(back))
            downloaded = time.perf_counter()
            assert back.stat().st_size == size
            await sftp.remove("bench.bin")
            if i:
                best["upload"] = max(best["upload"], size / (uploaded - begun) / 1e6)
                best["download"] = max(best["download"], size / (downloaded - uploaded) / 1e6)
    return best


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="spur-bench-ssh-", dir="/tmp"))
    root.chmod(0o711)
    local = Path(tempfile.mkdtemp(prefix="spur-bench-sftp-"))
    key = asyncssh.generate_private_key("ssh-ed25519")
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.Process(target=serve, args=(root, public_line(key), theirs))
    server.start()
    try:
        port = int(ours.recv())
        found = asyncio.run(measure(port, key))
        sftp = asyncio.run(measure_sftp(port, key, local))
    finally:
        ours.send("done")
        server.join(30)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    print(f"SSH into a running job, {RUNS} runs each (after {WARM_UP}), loopback\n")
    print(f"{'':18} {'p50 ms':>8} {'p99 ms':>8}")
    summary: dict[str, Any] = {"bench": "ssh", "runs": RUNS}
    for name, values in found.items():
        p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
        print(f"{name:18} {p50:8.1f} {p99:8.1f}")
        slug = name.replace(" + ", "_").replace(" ", "_")
        summary[f"{slug}_p50_ms"] = round(p50, 1)
        summary[f"{slug}_p99_ms"] = round(p99, 1)
    print(f"\nSFTP, a {TRANSFER_MIB} MiB file, best of {TRANSFER_RUNS} (after 1), loopback\n")
    print(f"{'':18} {'MB/s':>8}")
    for name, rate in sftp.items():
        print(f"{'sftp ' + name:18} {rate:8.1f}")
        summary[f"sftp_{name}_mb_s"] = round(rate, 1)
    summary["sftp_file_mib"] = TRANSFER_MIB
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
