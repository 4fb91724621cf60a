"""Nodes and partitions in Slurm's v0.0.4x shapes, from what the web API shows tenants
(jobs.selectors.tenant_node: no agent URLs, no device indices others hold); and the
bodies of `ping` and `diag`."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from django.conf import settings

from scheduler.core.contract import JobState
from scheduler.slurm import hostlist
from spurcloud.slurmrestd.jobinfo import number

# Our node states -> Slurm's (node_states is a list: base state plus flags).
NODE_STATES: dict[str, list[str]] = {
    "idle": ["IDLE"],
    "mix": ["MIXED"],
    "alloc": ["ALLOCATED"],
    "down": ["DOWN"],
    "drain": ["IDLE", "DRAIN"],
}


def _gres(gpus: list[dict[str, Any]]) -> str:
    models = Counter(str(g.get("model") or "gpu") for g in gpus)
    return ",".join(f"gpu:{model}:{count}" for model, count in sorted(models.items()))


def _gres_used(gpus: list[dict[str, Any]], in_use: int) -> str:
    """How many GPUs are held (by model when the node has one), never which: the indices
    would show other tenants' allocations."""
    models = {str(g.get("model") or "gpu") for g in gpus}
    if not gpus:
        return ""
    return f"gpu:{models.pop()}:{in_use}" if len(models) == 1 else f"gpu:{in_use}"


def node(n: dict[str, Any]) -> dict[str, Any]:
    """A tenant's node dict (TENANT_NODE_KEYS) as Slurm's node."""
    cpus = int(n.get("cpus") or 0)
    alloc_cpus = int(n.get("cpus_alloc") or 0)
    memory = int(n.get("memory_mb") or 0)
    alloc_memory = int(n.get("memory_alloc_mb") or 0)
    gpus = list(n.get("gpus") or ())
    gpus_alloc = int(n.get("gpus_alloc") or 0)
    tres = f"cpu={cpus},mem={memory}M,billing={cpus}"
    if gpus:
        tres += f",gres/gpu={len(gpus)}"
    used = f"cpu={alloc_cpus},mem={alloc_memory}M"
    if gpus_alloc:
        used += f",gres/gpu={gpus_alloc}"
    return {
        "name": n["name"],
        "hostname": n["name"],
        "cluster_name": str(settings.SPUR_CLUSTER_NAME),
        "state": NODE_STATES.get(str(n.get("state")), ["UNKNOWN"]),
        "reason": n.get("reason") or "",
        "cpus": cpus,
        "effective_cpus": cpus,
        "boards": 1,
        "sockets": int(n.get("sockets") or 1),
        "cores": int(n.get("cores_per_socket") or cpus),
        "threads": int(n.get("threads_per_core") or 1),
        "real_memory": memory,
        "alloc_memory": alloc_memory,
        "alloc_cpus": alloc_cpus,
        "alloc_idle_cpus": max(0, cpus - alloc_cpus),
        "features": list(n.get("features") or ()),
        "active_features": list(n.get("features") or ()),
        "gres": _gres(gpus),
        "gres_used": _gres_used(gpus, gpus_alloc),
        "partitions": list(n.get("partitions") or ()),
        "tres": tres,
        "tres_used": used,
        "weight": 1,
    }


def partition(p: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    members = [str(name) for name in p.get("nodes") or ()]
    by_name = {str(n.get("name")): n for n in nodes}
    cpus = sum(int(by_name.get(name, {}).get("cpus") or 0) for name in members)
    return {
        "name": p["name"],
        "cluster": str(settings.SPUR_CLUSTER_NAME),
        "nodes": {"configured": hostlist.compress(members), "total": len(members)},
        "cpus": {"total": cpus},
        "defaults": {"time": number(p.get("default_time_min"), infinite=True)},
        "maximums": {"time": number(p.get("max_time_min"), infinite=True)},
        "partition": {"state": [str(p.get("state") or "up").upper()]},
    }


def ping(answer: dict[str, Any] | None, latency_us: int) -> dict[str, Any]:
    """One controller's ping. Its addresses are the cluster's business: the host shown
    is the controller's role, not where it listens."""
    up = answer is not None and bool(answer.get("ok"))
    return {
        "hostname": "spurctld",
        "pinged": "UP" if up else "DOWN",
        "responding": up,
        "latency": latency_us,
        "mode": "primary",
        "primary": True,
    }


def diag(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Statistics, as far as they are the caller's: its organisation's jobs now."""
    now = int(time.time())
    states = Counter(str(j.get("state")) for j in jobs)
    return {
        "req_time": number(now),
        "req_time_start": number(now),
        "server_thread_count": 1,
        "agent_queue_size": 0,
        "agent_count": 0,
        "agent_thread_count": 0,
        "dbd_agent_queue_size": 0,
        "jobs_pending": states[JobState.PENDING],
        "jobs_running": states[JobState.RUNNING] + states[JobState.COMPLETING],
        "jobs_completed": states[JobState.COMPLETED],
        "jobs_canceled": states[JobState.CANCELLED],
        "jobs_failed": states[JobState.FAILED]
        + states[JobState.TIMEOUT]
        + states[JobState.NODE_FAIL],
        "job_states_ts": number(now),
    }
