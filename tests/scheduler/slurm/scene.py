"""Web API objects that rebuild the golden captures' cluster: partition `gpu` with
`gpu[01-04]` (64 CPUs, 512 GiB, 8 MI300X each) and the jobs of scene 1 (files 20-29)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

NOW = datetime(2026, 11, 30, 4, 5, 45, tzinfo=UTC)


def iso(moment: datetime | None) -> str | None:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else None


def job(
    job_id: int,
    name: str,
    state: str,
    *,
    reason: str = "None",
    nodes: list[str] | None = None,
    num_nodes: int = 1,
    num_cpus: int = 1,
    gpus_per_node: int = 0,
    gpu_type: str = "",
    submit: datetime | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    exit_code: int | None = None,
    signal: int | None = None,
    time_limit_min: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    nodes = nodes or []
    return {
        "job_id": job_id,
        "name": name,
        "tenant": "acme",
        "user": "root",
        "account": "root",
        "partition": "gpu",
        "qos": "normal",
        "state": state,
        "reason": reason,
        "submit_time": iso(submit or NOW - timedelta(seconds=10)),
        "eligible_time": iso(submit or NOW - timedelta(seconds=10)),
        "start_time": iso(start),
        "end_time": iso(end),
        "time_limit_min": time_limit_min,
        "nodes": nodes,
        "num_nodes": num_nodes,
        "num_cpus": num_cpus,
        "num_gpus": gpus_per_node * num_nodes,
        "allocation": {
            n: {"gpus": list(range(gpus_per_node)), "cpus": num_cpus // max(len(nodes), 1)}
            for n in nodes
        },
        "exit_code": exit_code,
        "signal": signal,
        "attempt": 0,
        "workdir": "/home/alice/work",
        "stdout": "/dev/null",
        "stderr": "",
        "seq": job_id,
        "spec": {"gpus_per_node": gpus_per_node, "gpu_type": gpu_type},
        **extra,
    }


def scene_jobs() -> list[dict[str, Any]]:
    """Jobs 10-15 three seconds after 10-12 started, in no particular order."""
    started = NOW - timedelta(seconds=3)
    return [
        job(12, "six", "RUNNING", nodes=["gpu04"], gpus_per_node=6, start=started),
        job(15, "wait_dep", "PENDING", reason="Dependency", gpus_per_node=1),
        job(13, "wait_res", "PENDING", reason="Resources", gpus_per_node=4),
        job(
            10,
            "big2n",
            "RUNNING",
            nodes=["gpu01", "gpu02"],
            num_nodes=2,
            num_cpus=2,
            gpus_per_node=8,
            start=started,
        ),
        job(14, "wait_prio", "PENDING", reason="Priority", gpus_per_node=4),
        job(11, "full8", "RUNNING", nodes=["gpu03"], gpus_per_node=8, start=started),
    ]


def node(name: str, state: str = "idle", cpus_alloc: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "cpus": 64,
        "memory_mb": 524288,
        "agent_url": f"http://{name}:6818",
        "sockets": 2,
        "cores_per_socket": 32,
        "threads_per_core": 1,
        "gpus": [
            {"index": i, "vendor": "amd", "model": "mi300x", "memory_mb": 196608} for i in range(8)
        ],
        "features": [],
        "labels": {},
        "state": state,
        "reason": "",
        "cpus_alloc": cpus_alloc,
        "memory_alloc_mb": 0,
        "gpus_alloc": 0,
        "gpus_in_use": [],
        "partitions": ["gpu"],
        "last_seen": 0,
    }


def nodes(state: str = "idle", cpus_alloc: int = 0) -> list[dict[str, Any]]:
    return [node(f"gpu{i:02d}", state, cpus_alloc) for i in range(1, 5)]


def partitions() -> list[dict[str, Any]]:
    return [
        {
            "name": "gpu",
            "default": True,
            "state": "up",
            "max_time_min": None,
            "default_time_min": None,
            "nodes": [f"gpu{i:02d}" for i in range(1, 5)],
        }
    ]
