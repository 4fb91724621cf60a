"""sacct's rows of job objects: the rows answer (`GET /api/v1/jobs`, ISO 8601 times, a
single job's answer with its spec), made into sacct's rows and lines through the same
columns as the columns answer (`sacct_format`).

sacct itself reads the columns answer and never imports this; what holds whole job
objects (`scheduler.cli.sacct.select_jobs`, the golden, projection and property tests)
comes here.
"""

from __future__ import annotations

from scheduler.slurm.sacct_format import (
    FIELDS,
    SELECTION,
    STEP_FIELDS,
    Column,
    Rows,
    format_rows,
    rows_of,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime
    from typing import Any

    Job = Mapping[str, Any]


class Record:
    """One sacct row of a job object: the job's (`step=None`), its batch step's, or a
    job step's (with the step's own values, `view`)."""

    __slots__ = ("job", "now", "step", "view")

    def __init__(
        self, job: Job, step: str | None, now: datetime, view: dict[str, Any] | None = None
    ) -> None:
        self.job, self.step, self.now, self.view = job, step, now, view

    @property
    def is_step(self) -> bool:
        return self.step is not None


# What a job object that carries its spec (a single job's answer) may hold there only.
_FROM_SPEC = ("gpu_type", "comment", "mem_per_node_mb")


def as_columns(jobs: Sequence[Job]) -> dict[str, list[Any]]:
    """Job objects of the rows answer (ISO 8601 times) as the columns answer holds them:
    the same fields, times in epoch seconds, and what a spec they carry holds."""
    from scheduler.core.contract.job_object import TIME_FIELDS
    from scheduler.slurm.timefmt import parse_iso

    names = {name for job in jobs for name in job} | set(_FROM_SPEC)
    names |= {n for _, _, reads, _ in FIELDS.values() for n in reads} | set(SELECTION)
    names |= set(STEP_FIELDS)
    cols: dict[str, list[Any]] = {}
    for name in sorted(names):
        values = [_with_spec(job, name) for job in jobs]
        if name in TIME_FIELDS:
            moments = [parse_iso(v) if isinstance(v, str) else None for v in values]
            values = [None if m is None else int(m.timestamp()) for m in moments]
        cols[name] = values
    return cols


def _with_spec(job: Job, name: str) -> Any:
    value = job.get(name)
    spec = job.get("spec")
    if not value and name in _FROM_SPEC and isinstance(spec, dict):
        return spec.get(name) or value
    return value


def records(jobs: Iterable[Job], *, now: datetime, allocations_only: bool) -> list[Record]:
    """The rows of job objects (`rows_of`)."""
    listed = list(jobs)
    rows = rows_of(as_columns(listed), range(len(listed)), allocations_only=allocations_only)
    return [
        Record(listed[j], step, now, rows.views.get(i))
        for i, (j, step) in enumerate(zip(rows.jobs, rows.steps, strict=True))
    ]


def format_sacct(
    rows: Iterable[Record],
    columns: list[Column],
    *,
    header: bool = True,
    parsable: str = "",
    delimiter: str = "|",
) -> list[str]:
    """sacct's lines for the rows of job objects (`records`)."""
    listed = list(rows)
    jobs: list[Job] = []
    index: dict[int, int] = {}
    table = Rows()
    for record in listed:
        key = id(record.job)
        if key not in index:
            index[key] = len(jobs)
            jobs.append(record.job)
        table.add(index[key], record.step, record.view)
    now = listed[0].now.timestamp() if listed else 0.0
    return format_rows(
        as_columns(jobs), table, columns, now=now, header=header, parsable=parsable,
        delimiter=delimiter,
    )  # fmt: skip
