"""Job ids as Slurm's commands write them: `123`, an array task `123_4`, a set of tasks
`123_[5-9]`; and the pending remainder of an array as squeue shows it, `123_[5-9%2]`.

A job object is one task, or an array's pending remainder (`array_tasks` holds its task
ids, as the history keeps it and sacct shows it: one row `123_[5-9]`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.arrays import compress, parse_array
from scheduler.core.contract import JobState
from scheduler.core.errors import Rejected

Job = Mapping[str, Any]
_REF_RE = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]+\]))?$")


@dataclass(frozen=True)
class JobRef:
    job_id: int
    tasks: frozenset[int] | None = None  # None: the job, or every task of that array

    def matches(self, job: Job) -> bool:
        array_id = job.get("array_job_id")
        if self.tasks is None:
            return int(job["job_id"]) == self.job_id or array_id == self.job_id
        if array_id != self.job_id:
            return False
        return not self.tasks.isdisjoint(task_ids(job))


def parse_job_ref(text: str) -> JobRef:
    """ValueError for anything that is not a job id, `N_i` or `N_[i-j,...]`."""
    match = _REF_RE.match(text.strip())
    if match is None:
        raise ValueError(f"Invalid job id: {text}")
    base, tasks = int(match.group(1)), match.group(2)
    if tasks is None:
        return JobRef(base)
    try:
        ids, _ = parse_array(tasks.strip("[]"))
    except Rejected as exc:
        raise ValueError(f"Invalid job id: {text}") from exc
    return JobRef(base, frozenset(ids))


def task_ids(job: Job) -> tuple[int, ...]:
    """The array task ids a job object stands for: its own, or its remainder's."""
    if job.get("array_tasks"):
        return parse_array(str(job["array_tasks"]))[0]
    task = job.get("array_task_id")
    return () if task is None else (int(task),)


def display_id(job: Job) -> str:
    """`123_4` for an array task, `123_[5-9]` for its pending remainder, else the job id."""
    if job.get("array_display"):
        return str(job["array_display"])
    if job.get("array_job_id") is None:
        return str(job["job_id"])
    if job.get("array_tasks"):
        return f"{job['array_job_id']}_[{job['array_tasks']}]"
    return f"{job['array_job_id']}_{job['array_task_id']}"


def collapse_pending(jobs: Iterable[Job]) -> list[Job]:
    """squeue without `-r`: the pending tasks of an array as one line, `17_[2-3%2]`,
    standing where the array's first pending task stood."""
    out: list[Job] = []
    groups: dict[int, list[Job]] = {}
    for job in jobs:
        array_id = job.get("array_job_id")
        if array_id is None or job.get("state") != JobState.PENDING:
            out.append(job)
            continue
        if array_id not in groups:
            groups[array_id] = []
            out.append({"_array_group": array_id})
        groups[array_id].append(job)
    result: list[Job] = []
    for job in out:
        group = groups.get(job.get("_array_group", -1))
        if group is None:
            result.append(job)
            continue
        first = group[0]
        throttle = int(first.get("array_throttle") or 0)
        ids = [i for t in group for i in task_ids(t)]
        tasks = compress(ids)
        if len(ids) == 1 and not throttle:
            result.append(first)
            continue
        limit = f"%{throttle}" if throttle else ""
        result.append({**first, "array_display": f"{first['array_job_id']}_[{tasks}{limit}]"})
    return result


__all__ = ["JobRef", "collapse_pending", "display_id", "parse_job_ref", "task_ids"]
