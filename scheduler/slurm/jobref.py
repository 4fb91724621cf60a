"""Job ids as Slurm's commands write them: `123`, an array task `123_4`, a set of tasks
`123_[5-9]`; and the pending remainder of an array as squeue shows it, `123_[5-9%2]`.

A job object is one task, or an array's pending remainder (`array_tasks` holds its task
ids, as the history keeps it and sacct shows it: one row `123_[5-9]`)."""

from __future__ import annotations

from scheduler.core.contract import JobState
from scheduler.slurm.lazyre import LazyPattern

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    Job = Mapping[str, Any]

_REF_RE = LazyPattern(r"^(\d+)(?:_(\d+|\[[^\]]+\]))?$")


class JobRef:
    """A job id as given: `job_id` with the `tasks` of that array it names, or None for
    the job itself (or every task of the array job it is)."""

    __slots__ = ("job_id", "tasks")

    def __init__(self, job_id: int, tasks: frozenset[int] | None = None) -> None:
        self.job_id, self.tasks = job_id, tasks

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobRef) and (self.job_id, self.tasks) == (
            other.job_id,
            other.tasks,
        )

    def __hash__(self) -> int:
        return hash((self.job_id, self.tasks))

    def __repr__(self) -> str:
        return f"JobRef({self.job_id!r}, {self.tasks!r})"

    def matches(self, job: Job) -> bool:
        return self.names(
            int(job["job_id"]),
            job.get("array_job_id"),
            job.get("array_task_id"),
            job.get("array_tasks"),
        )

    def names(
        self,
        job_id: int,
        array_job_id: int | None,
        array_task_id: int | None,
        array_tasks: str | None = None,
    ) -> bool:
        """`matches`, from a job's ids (a columns answer's values); `array_tasks` is a
        pending remainder's task ids (the history's one row `123_[5-9]`)."""
        if self.tasks is None:
            return job_id == self.job_id or array_job_id == self.job_id
        if array_job_id != self.job_id:
            return False
        if array_task_id in self.tasks:
            return True
        return bool(array_tasks) and not self.tasks.isdisjoint(_parse_tasks(str(array_tasks)))


def parse_job_ref(text: str) -> JobRef:
    """ValueError for anything that is not a job id, `N_i` or `N_[i-j,...]`."""
    ref = text.strip()
    if ref.isdecimal():  # a plain id, read as the pattern reads it (`\d+`), without `re`
        return JobRef(int(ref))
    match = _REF_RE.match(ref)
    if match is None:
        raise ValueError(f"Invalid job id: {text}")
    base, tasks = int(match.group(1)), match.group(2)
    if tasks is None:
        return JobRef(base)
    from scheduler.core.arrays import parse_array  # only for a set of tasks
    from scheduler.core.errors import Rejected

    try:
        ids, _ = parse_array(tasks.strip("[]"))
    except Rejected as exc:
        raise ValueError(f"Invalid job id: {text}") from exc
    return JobRef(base, frozenset(ids))


def _parse_tasks(text: str) -> tuple[int, ...]:
    from scheduler.core.arrays import parse_array  # only for a remainder's tasks

    return tuple(parse_array(text)[0])


def task_ids(job: Job) -> tuple[int, ...]:
    """The array task ids a job object stands for: its own, or its remainder's."""
    if job.get("array_tasks"):
        return _parse_tasks(str(job["array_tasks"]))
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
    from scheduler.core.arrays import compress

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
