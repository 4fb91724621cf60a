"""Our job object (the web API's: the contract's `JOB_FIELDS`, times as ISO 8601) as
Slurm's v0.0.4x `job_info`: the one place this translation is written. Numbers are
Slurm's `{set, infinite, number}`, `job_state` a list, `exit_code` `{status,
return_code, signal}`."""

from __future__ import annotations

import signal as signals
from datetime import datetime
from typing import Any

from django.conf import settings

from scheduler.core.contract import JobState
from scheduler.slurm import hostlist


def number(value: int | float | None, *, infinite: bool = False) -> dict[str, Any]:
    """Slurm's `{set, infinite, number}`: None is unset (or infinite, when it means so)."""
    if value is None:
        return {"set": False, "infinite": infinite, "number": 0}
    return {"set": True, "infinite": False, "number": int(value)}


def epoch(iso: str | None) -> int | None:
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())


def signal_name(number_: int) -> str:
    try:
        return signals.Signals(number_).name
    except ValueError:
        return ""


def exit_code(job: dict[str, Any]) -> dict[str, Any]:
    code, sig = job.get("exit_code"), int(job.get("signal") or 0)
    if sig:
        status = "SIGNALED"
    elif code is None:
        status = "PENDING"
    else:
        status = "SUCCESS" if code == 0 else "ERROR"
    return {
        "status": [status],
        "return_code": number(code),
        "signal": {"id": number(sig if sig else None), "name": signal_name(sig) if sig else ""},
    }


def gres(count: int, gpu_type: str) -> str:
    return f"gres/gpu:{gpu_type}:{count}" if gpu_type else f"gres/gpu:{count}"


def job_info(job: dict[str, Any]) -> dict[str, Any]:
    """One job object (from the live queue or the history) as Slurm's job_info."""
    spec: dict[str, Any] = job.get("spec") or {}
    nodes = [str(n) for n in job.get("nodes") or ()]
    num_nodes = int(job.get("num_nodes") or 1)
    num_gpus = int(job.get("num_gpus") or 0)
    gpu_type = str(job.get("gpu_type") or "")
    num_cpus = int(job.get("num_cpus") or 0)
    tres = [f"cpu={num_cpus}", f"node={num_nodes}", f"billing={num_cpus}"]
    if num_gpus:
        tres.append(f"gres/gpu={num_gpus}")
    dependency = str(job.get("dependency") or "")
    state = JobState(job["state"])
    out: dict[str, Any] = {
        "account": job.get("account", ""),
        "array_job_id": number(job.get("array_job_id") or 0),
        "array_task_id": number(job.get("array_task_id")),
        "batch_flag": True,
        "batch_host": nodes[0] if nodes else "",
        "cluster": str(settings.SPUR_CLUSTER_NAME),
        "comment": job.get("comment", ""),
        "current_working_directory": job.get("workdir", ""),
        "dependency": "" if dependency == "(null)" else dependency,
        "eligible_time": number(epoch(job.get("eligible_time"))),
        "end_time": number(epoch(job.get("end_time"))),
        "exit_code": exit_code(job),
        "derived_exit_code": exit_code(job),
        "group_name": job.get("tenant", ""),
        "job_id": int(job["job_id"]),
        "job_state": [state.value],
        "name": job.get("name", ""),
        "nodes": hostlist.compress(nodes),
        "node_count": number(num_nodes),
        "cpus": number(num_cpus),
        "partition": job.get("partition", ""),
        "qos": job.get("qos", ""),
        "restart_cnt": max(0, int(job.get("attempt") or 0) - 1),
        "standard_output": job.get("stdout", ""),
        "standard_error": job.get("stderr", ""),
        "standard_input": spec.get("stdin", ""),
        # "Time execution began, or is expected to begin" (the schema): a pending job's
        # expected start, where the leader's last estimate has one.
        "start_time": number(
            epoch(job.get("expected_start" if state is JobState.PENDING else "start_time"))
        ),
        "submit_time": number(epoch(job.get("submit_time"))),
        "state_reason": job.get("reason", "") or "None",
        "state_description": "",
        "time_limit": number(job.get("time_limit_min"), infinite=True),
        "tres_per_node": gres(-(-num_gpus // num_nodes), gpu_type) if num_gpus else "",
        "tres_req_str": ",".join(tres),
        "tres_alloc_str": ",".join(tres) if nodes else "",
        "user_name": job.get("user", ""),
    }
    if "priority" in job:
        out["priority"] = number(job.get("priority"))
    if "held" in job:
        out["hold"] = bool(job["held"])
    if spec:
        out["tasks"] = number(spec.get("ntasks"))
        out["cpus_per_task"] = number(spec.get("cpus_per_task"))
        out["nice"] = int(spec.get("nice") or 0)
        out["features"] = spec.get("constraint", "")
        out["memory_per_node"] = number(spec.get("mem_per_node_mb"))
        if spec.get("requeue") is not None:
            out["requeue"] = bool(spec["requeue"])
    return out
