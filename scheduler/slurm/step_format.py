"""`scontrol show step`: a running job's steps as Slurm 22.05 prints them, the batch step
first (`N.batch`, on the job's first node), then its srun steps (`N.0`, `N.1`, ...).

What Spur does not track prints as Slurm prints an unknown: the host and pid of the
srun that made a step (`SrunHost:Pid=(null):0`), and a step's memory and GPUs, which
its TRES leaves out (Slurm's lists `mem=` and `gres/gpu=` where they were asked for).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from scheduler.core.contract.states import JobState
from scheduler.slurm.hostlist import compress
from scheduler.slurm.jobref import display_id
from scheduler.slurm.scontrol_format import Record
from scheduler.slurm.timefmt import format_timestamp, parse_iso

Obj = Mapping[str, Any]

# The job object fields the steps' records read (scontrol asks the API for these only).
FIELDS = (
    "job_id",
    "array_job_id",
    "array_task_id",
    "state",
    "partition",
    "nodes",
    "start_time",
    "interactive",
    "steps",
)


def _stamp(value: Any) -> str:
    if isinstance(value, int | float):
        return format_timestamp(datetime.fromtimestamp(float(value), tz=UTC))
    moment = parse_iso(value) if isinstance(value, str) else None
    return format_timestamp(moment) if moment is not None else "Unknown"


def step_records(job: Obj) -> list[tuple[str, Record]]:
    """(step name, record) for each running step of `job`: "batch", "0", "1", ..."""
    if job.get("state") != JobState.RUNNING:
        return []
    shown = display_id(job)
    out: list[tuple[str, Record]] = []
    nodes = [str(n) for n in job.get("nodes") or []]
    if nodes and not job.get("interactive"):
        batch = _record(
            f"{shown}.batch",
            job,
            job.get("start_time"),
            nodes[:1],
            cpus=0,
            tasks=1,
            name="batch",
            tres="(null)",
            dist="",
        )
        out.append(("batch", batch))
    for step in job.get("steps") or ():
        if not isinstance(step, Mapping) or step.get("state") != JobState.RUNNING:
            continue
        step_nodes = [str(n) for n in step.get("nodes") or []]
        cpus = int(step.get("cpus") or 0)
        record = _record(
            f"{shown}.{step.get('step_id')}",
            job,
            step.get("start_time"),
            step_nodes,
            cpus=cpus,
            tasks=int(step.get("ntasks") or 1),
            name=str(step.get("name") or ""),
            tres=f"cpu={cpus},node={len(step_nodes)}",
            dist=" Dist=Cyclic",
        )
        out.append((str(step.get("step_id")), record))
    return out


def _record(
    step_id: str,
    job: Obj,
    start: Any,
    nodes: list[str],
    *,
    cpus: int,
    tasks: int,
    name: str,
    tres: str,
    dist: str,
) -> Record:
    return [
        f"StepId={step_id} UserId={int(job.get('uid') or 0)} StartTime={_stamp(start)} "
        "TimeLimit=UNLIMITED",
        f"State={JobState.RUNNING} Partition={job.get('partition', '')} NodeList={compress(nodes)}",
        f"Nodes={len(nodes)} CPUs={cpus} Tasks={tasks} Name={name} Network=(null)",
        f"TRES={tres}",
        "ResvPorts=(null)",
        f"CPUFreqReq=Default{dist}",
        "SrunHost:Pid=(null):0",
    ]
