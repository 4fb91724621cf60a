"""The columns answer's run-length form (`?shape=runs`): a column whose values come in
long runs of one value (10,000 pending jobs of one user, one partition, one state and one
reason) is sent as `{"runs": [[value, count], ...]}`; any other stays the plain list of
`shape=columns`. What squeue and sacct read: a queue of 10,000 held jobs is then about 50
kB, not 1 MB, to encode, send and decode.

Written by the controller (the live queue) and the web (the history), read by the Slurm
commands (`scheduler.cli.api`); it imports nothing but itertools, as the commands start
with it (tests/scheduler/cli/test_startup.py).
"""

from __future__ import annotations

from itertools import chain, groupby, repeat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RUNS = "runs"


def encode_column(values: list[Any]) -> list[Any] | dict[str, list[list[Any]]]:
    """`values` as runs if they make at most half as many runs as values, else as they
    are. A column of distinct values (the job ids) is told by its set, at C speed, before
    any run is counted."""
    count = len(values)
    if count < 2:
        return values
    first = values[0]
    if values.count(first) == count:  # one value throughout: the common case
        return {RUNS: [[first, count]]}
    try:
        if 2 * len(set(values)) > count:
            return values  # more distinct values than half: more runs than half
    except TypeError:
        pass  # lists (a job's nodes): counted below
    runs: list[list[Any]] = []
    for value, group in groupby(values):
        runs.append([value, sum(1 for _ in group)])
        if 2 * len(runs) > count:
            return values
    return {RUNS: runs}


def encode(columns: dict[str, list[Any]]) -> dict[str, Any]:
    """A columns answer's columns (`job_object.columns_answer`), each in runs where that
    is shorter (`encode_column`)."""
    return {name: encode_column(values) for name, values in columns.items()}


def decode_column(column: Any, count: int) -> list[Any]:
    """One column of a `shape=runs` answer as the plain list of `count` values; ValueError
    if it is neither a list of `count` values nor runs of `count` in all. Values repeated
    from one run are one object: read them, do not change them."""
    if type(column) is list:
        if len(column) != count:
            raise ValueError(f"{len(column)} values for {count} jobs")
        return column
    runs = column.get(RUNS) if type(column) is dict else None
    if type(runs) is not list or not all(
        type(run) is list and len(run) == 2 and type(run[1]) is int and run[1] > 0 for run in runs
    ):
        raise ValueError("neither a list nor runs of [value, count]")
    total = sum(run[1] for run in runs)
    if total != count:  # before anything is repeated: a count is no reason to fill memory
        raise ValueError(f"runs of {total} values for {count} jobs")
    return list(chain.from_iterable(repeat(value, n) for value, n in runs))


__all__ = ["RUNS", "decode_column", "encode", "encode_column"]
