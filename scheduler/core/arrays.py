"""Job arrays: Slurm's `--array` expressions, the compact form squeue prints, and the
pending remainder.

`0-15%4` (throttle: at most 4 tasks run at once), `0,6,16-32`, `0-15:4` (step).

An array's pending tasks are one record, as Slurm keeps them (its meta job): a submit of
`--array=0-999` stores one `Job` (the lowest pending task) whose `array_pending` holds
the job ids of the other 999, and emits one event. The task at position p of the array's
task ids has job id `array_job_id + p` (reserved at submit), so every task keeps the id
it always had. A task leaves the remainder (`split`) when the pass starts it or a
command names it (scancel 123_5, hold, release, update, a dependency on 123_5); the
record then stands for the rest. Readers that list tasks (the live queue, sprio) see
each task through `tasks_of` (a copy of the remainder with the task's ids, never
stored), and `lookup` finds a task by its job id wherever it is.
"""

from __future__ import annotations

import copy
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from scheduler.core.errors import Rejected

if TYPE_CHECKING:
    from scheduler.core.effects import Effect
    from scheduler.core.jobs import Job

MAX_ARRAY_SIZE = 1001  # Slurm's MaxArraySize default: task ids 0..1000
BAD_ARRAY = "Invalid job array specification"


def parse_array(expr: str) -> tuple[tuple[int, ...], int]:
    """Task ids (sorted, unique) and the throttle (0: none) of an `--array` value."""
    text = expr.strip()
    throttle = 0
    if "%" in text:
        text, _, limit = text.partition("%")
        if not limit.isdigit() or int(limit) < 1:
            raise Rejected(f"{BAD_ARRAY}: bad throttle in {expr!r}", code="invalid_array")
        throttle = int(limit)
    ranges = [_range(part, expr) for part in text.split(",")]
    # Bounded before anything is expanded: `0-100000000` must cost nothing.
    if any(r and r[-1] >= MAX_ARRAY_SIZE for r in ranges):
        raise Rejected(
            f"{BAD_ARRAY}: task ids must be below {MAX_ARRAY_SIZE} in {expr!r}",
            code="invalid_array",
        )
    ids = {i for r in ranges for i in r}
    if not ids:
        raise Rejected(f"{BAD_ARRAY}: {expr!r} names no tasks", code="invalid_array")
    return tuple(sorted(ids)), throttle


@lru_cache(maxsize=4096)
def task_ids(expr: str) -> tuple[int, ...]:
    """The task ids of an accepted `--array` value (memoised: the remainder's tasks are
    named by position in it)."""
    return parse_array(expr)[0]


def _range(part: str, expr: str) -> range:
    bounds, _, step_text = part.partition(":")
    first, dash, last = bounds.partition("-")
    try:
        lo = _nonneg(first)
        hi = _nonneg(last) if dash else lo
        step = _nonneg(step_text) if step_text else 1
    except ValueError:
        raise Rejected(f"{BAD_ARRAY}: {expr!r}", code="invalid_array") from None
    if hi < lo or step < 1 or (step_text and not dash):
        raise Rejected(f"{BAD_ARRAY}: {expr!r}", code="invalid_array")
    return range(lo, hi + 1, step)


def _nonneg(text: str) -> int:
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def compress(ids: Iterable[int]) -> str:
    """`[0, 1, 2, 5, 7, 8]` -> `0-2,5,7-8`, as squeue prints the pending tasks."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(_run(run))
        run = [i]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


# -- the pending remainder --------------------------------------------------------------


class Remainders:
    """Which record holds each array's pending remainder, and the arrays that have one in
    id order (a job id is found in its array's range by bisection). Derived from the
    jobs (`of`): never pickled, rebuilt with the state."""

    def __init__(self) -> None:
        self.holder: dict[int, int] = {}  # array job id -> job id of its remainder
        self.arrays: list[int] = []  # array job ids that have one, ascending

    @classmethod
    def of(cls, jobs: Mapping[int, Job]) -> Remainders:
        out = cls()
        for job_id, job in sorted(jobs.items()):
            if job.array_pending:
                assert job.array_job_id is not None
                out.holder[job.array_job_id] = job_id
                out.arrays.append(job.array_job_id)
        return out

    def set(self, array_id: int, job_id: int | None) -> None:
        if job_id is None:
            if self.holder.pop(array_id, None) is not None:
                del self.arrays[bisect_left(self.arrays, array_id)]
            return
        if array_id not in self.holder:
            if not self.arrays or self.arrays[-1] < array_id:
                self.arrays.append(array_id)  # a new array: the newest
            else:
                self.arrays.insert(bisect_left(self.arrays, array_id), array_id)
        self.holder[array_id] = job_id

    def holding(self, jobs: Mapping[int, Job], job_id: int) -> Job | None:
        """The remainder that `job_id` is a pending task of (not its own record), or None."""
        i = bisect_right(self.arrays, job_id) - 1
        if i < 0:
            return None
        rest = jobs[self.holder[self.arrays[i]]]
        pending = rest.array_pending
        k = bisect_left(pending, job_id)
        return rest if k < len(pending) and pending[k] == job_id else None


def task_of(rest: Job, job_id: int) -> Job:
    """Task `job_id` of the remainder `rest`, as its own job (a copy; stored or not)."""
    assert rest.array_job_id is not None
    task = copy.copy(rest)
    task.job_id = job_id
    task.array_task_id = task_ids(rest.spec.array)[job_id - rest.array_job_id]
    task.array_pending = ()
    task.allocation = {}
    return task


def tasks_of(job: Job) -> Iterator[Job]:
    """The tasks a record stands for: itself, or each task of a remainder."""
    if not job.array_pending:
        yield job
        return
    yield task_of(job, job.job_id)
    for job_id in job.array_pending:
        yield task_of(job, job_id)


class ArrayBook(Protocol):
    """What the remainder's operations read and change of the state."""

    @property
    def jobs(self) -> dict[int, Job]: ...
    @property
    def remainders(self) -> Remainders: ...

    def touch(self, job_id: int) -> None: ...
    def emit(self, job: Job, kind: str, now: float) -> Effect: ...
    def note_effects(self, effects: Iterable[Effect]) -> None: ...
    def note_remainder(self, job_id: int) -> None: ...


def lookup(state: ArrayBook, job_id: int) -> Job | None:
    """The job `job_id` wherever it is: a stored job (a remainder's record stands for its
    lowest task here: `task_of` it for that task alone), or a copy of a pending task of
    a remainder. None if unknown."""
    job = state.jobs.get(job_id)
    if job is not None:
        return job
    rest = state.remainders.holding(state.jobs, job_id)
    return None if rest is None else task_of(rest, job_id)


def split(state: ArrayBook, job_id: int, now: float) -> Job | None:
    """Task `job_id` as a job of its own, out of its array's remainder if it was in one
    (the remainder then stands for the rest); None if unknown. The task's event goes out
    now (its history row), the remainder's at the end of the command (one per command,
    however many tasks left it)."""
    job = state.jobs.get(job_id)
    if job is not None and not job.array_pending:
        return job
    if job is not None:  # the remainder's own task: the rest moves to the next one
        assert job.array_job_id is not None
        pending = job.array_pending
        job.array_pending = ()
        rest = task_of(job, pending[0])
        rest.array_pending = pending[1:]
        state.jobs[rest.job_id] = rest
        task = job
    else:
        holder = state.remainders.holding(state.jobs, job_id)
        if holder is None:
            return None
        assert holder.array_job_id is not None
        task = task_of(holder, job_id)
        pending = holder.array_pending
        k = bisect_left(pending, job_id)
        holder.array_pending = pending[:k] + pending[k + 1 :]
        state.jobs[job_id] = task
        rest = holder
    assert rest.array_job_id is not None
    state.remainders.set(rest.array_job_id, rest.job_id if rest.array_pending else None)
    state.touch(task.job_id)
    state.touch(rest.job_id)
    state.note_remainder(rest.job_id)
    state.note_effects([state.emit(task, "split", now)])
    return task


__all__ = [
    "MAX_ARRAY_SIZE",
    "Remainders",
    "compress",
    "lookup",
    "parse_array",
    "split",
    "task_ids",
    "task_of",
    "tasks_of",
]
