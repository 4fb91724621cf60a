"""sacct's output from the web API's job history: fixed-width columns with a `+` where a
value is cut, or `|`-separated (`-p`, `-P`), and a `.batch` step row after every job
that started, as Slurm's accounting records one, then its job steps (srun: `N.0`, ...).

sacct reads the history as columns (`GET /api/v1/jobs?shape=columns`: a list per job
field, times in epoch seconds). Its rows (`Rows`: a job, its batch step, its steps) are
printed a column at a time, each value computed once per distinct (row kind, values)
(`columns.texts`): ten thousand finished jobs hold few distinct states, exit codes,
accounts or CPU counts. Job objects (the rows answer, ISO times) come through the same
columns by `sacct_records`.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import eq

from scheduler.core.contract import JobState
from scheduler.slurm.columns import seen_one, texts
from scheduler.slurm.states import TERMINAL, exit_code_text
from scheduler.slurm.timefmt import format_duration, format_epoch, format_sacct_limit

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    Columns = Mapping[str, Sequence[Any]]

DEFAULT_FIELDS = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF_FIELDS = "JobID,State,ExitCode"
LONG_FIELDS = (
    "JobID,JobIDRaw,JobName,Partition,Account,User,AllocCPUS,NCPUS,NNodes,NodeList,"
    "State,ExitCode,DerivedExitCode,Submit,Start,End,Elapsed,Timelimit,ReqTRES,AllocTRES"
)

# A row's `step`: None for the job's own row, "batch" for its batch step, or a job
# step's id (srun: "0", "1", ...), whose values come from the step itself.


def _srun(step: str | None) -> bool:
    return step is not None and step != "batch"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _first(nodes: Sequence[str] | None) -> str:
    return str(nodes[0]) if nodes else ""


def _compress(nodes: Sequence[str] | None) -> str:
    if not nodes:
        return ""
    from scheduler.slurm.hostlist import compress  # only for a column of node lists

    return compress(nodes)


def _cpus(
    step: str | None, num_cpus: Any, allocation: Any, nodes: Sequence[str] | None, num_nodes: Any
) -> int:
    if step != "batch":
        return int(num_cpus or 0)  # a job step's row holds its own CPUs here
    return _batch_cpus(num_cpus, allocation, nodes, num_nodes)


def _batch_cpus(num_cpus: Any, allocation: Any, nodes: Sequence[str] | None, num_nodes: Any) -> int:
    """A batch step holds what its job holds on its first node."""
    held = allocation.get(str(nodes[0])) if allocation and nodes else None
    if held and "cpus" in held:
        return int(held["cpus"])
    return -(-int(num_cpus or 0) // max(int(num_nodes or 1), 1))


def _nnodes(step: str | None, nodes: Sequence[str] | None, num_nodes: Any) -> int:
    if _srun(step):
        return len(nodes or ())
    return 1 if step else int(num_nodes or 0)


def _state(now: float, step: str | None, value: Any, cancelled_by_uid: Any) -> str:
    state = _text(value)
    if not step:
        if state == JobState.CANCELLED:
            return f"CANCELLED by {cancelled_by_uid or 0}"
        return state
    if state in (JobState.CANCELLED, JobState.TIMEOUT):
        return JobState.CANCELLED.value
    if state == JobState.COMPLETING:
        return JobState.RUNNING.value
    return state


def _elapsed(now: float, start: float | None, end: float | None) -> float:
    if start is None:
        return 0.0
    return max((now if end is None else end) - start, 0.0)


def _stamp(value: float | None, missing: str) -> str:
    return missing if value is None else format_epoch(value)


def _nodelist(now: float, step: str | None, nodes: Sequence[str] | None) -> str:
    if _srun(step):
        return _compress(nodes)
    if step:
        return _first(nodes)
    return _compress(nodes) or "None assigned"


def _tres(
    now: float,
    step: str | None,
    allocated: bool,
    start: Any,
    num_gpus: Any,
    gpu_type: Any,
    mem_per_node_mb: Any,
    num_cpus: Any,
    allocation: Any,
    nodes: Sequence[str] | None,
    num_nodes: Any,
) -> str:
    if allocated and start is None:
        return ""
    if not allocated and step:
        return ""
    # A batch step holds the first node; a job step (srun) its own nodes, whole.
    count = _nnodes(step, nodes, num_nodes) if _srun(step) else 1 if step else int(num_nodes or 1)
    cpus = _cpus(step, num_cpus, allocation, nodes, num_nodes)
    gpus = int(num_gpus or 0)
    if step and gpus:
        gpus = -(-gpus // max(int(num_nodes or 1), 1))
    held: Mapping[str, Any] = allocation or {}
    if allocated and held:
        chosen = [_first(nodes)] if step == "batch" else list(held)
        per_node = [held.get(n) or {} for n in chosen]
        gpus = sum(len(a.get("gpus") or []) for a in per_node)
        mem = sum(int(a.get("mem_mb") or 0) for a in per_node)
    else:
        mem = int(mem_per_node_mb or 0) * count
    parts = {"cpu": str(cpus), "node": str(count)}
    if not step:
        parts["billing"] = str(cpus)
    if mem:
        from scheduler.slurm.memfmt import format_mem_mb

        parts["mem"] = format_mem_mb(mem)
    if gpus:
        parts["gres/gpu"] = str(gpus)
        if gpu_type:
            parts[f"gres/gpu:{gpu_type}"] = str(gpus)
    # Slurm sorts the `name=count` strings, which puts `gres/gpu:type=` before `gres/gpu=`.
    return ",".join(sorted(f"{k}={v}" for k, v in parts.items()))


class Rowwise:
    """A column whose values differ on nearly every row (ids, names, CPU counts read
    from allocations): computed for all rows at once, `fn(now, steps, *sources)`, one
    list per field it reads, rather than value by value through a memo that would only
    cost."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., list[str]]) -> None:
        self.fn = fn


def _job_ids(
    now: float, steps: Sequence[str | None], ids: Sequence[int], arrays: Sequence[Any],
    tasks: Sequence[Any], remainders: Sequence[Any],
) -> list[str]:  # fmt: skip
    """`17_3.batch` for a step of an array task, `17_[5-9]` for an array's pending
    remainder (one row, as the history keeps it), as sacct prints them."""
    if arrays.count(None) == len(arrays):  # no array task among them: ids as they are
        shown: list[str] = list(map(str, ids))
    else:
        shown = [
            str(i) if a is None else f"{a}_[{r}]" if r else f"{a}_{t}"
            for i, a, t, r in zip(ids, arrays, tasks, remainders, strict=True)
        ]
    return [j if s is None else f"{j}.{s}" for j, s in zip(shown, steps, strict=True)]


def _raw_ids(now: float, steps: Sequence[str | None], ids: Sequence[int]) -> list[str]:
    return [str(i) if s is None else f"{i}.{s}" for i, s in zip(ids, steps, strict=True)]


def _names(now: float, steps: Sequence[str | None], names: Sequence[Any]) -> list[str]:
    return [
        "batch" if s == "batch" else n if type(n) is str else _text(n)
        for s, n in zip(steps, names, strict=True)
    ]


def _cpu_counts(
    now: float,
    steps: Sequence[str | None],
    cpus: Sequence[Any],
    allocations: Sequence[Any],
    nodes: Sequence[Any],
    num_nodes: Sequence[Any],
) -> list[str]:
    shown = {n: str(int(n or 0)) for n in set(cpus)}  # a few distinct counts in 10,000
    out = list(map(shown.__getitem__, cpus))
    texts: dict[int, str] = {}
    for i in compress(range(len(steps)), map(eq, steps, repeat("batch"))):
        n = _batch_cpus(cpus[i], allocations[i], nodes[i], num_nodes[i])
        out[i] = texts.get(n) or texts.setdefault(n, str(n))
    return out


def _on_job_row(value: Callable[[Any], str]) -> Callable[..., str]:
    """A column that only the job's own row fills (its steps' rows leave it empty)."""
    return lambda now, step, v: "" if step else value(v)


# What columns read of a job besides their own fields.
_ID = ("job_id", "array_job_id", "array_task_id", "array_tasks")
_NODES = ("nodes", "num_nodes")
_CPUS = ("num_cpus", "allocation", *_NODES)
_RAN = ("start_time", "end_time")
_TRES = ("start_time", "num_gpus", "gpu_type", "mem_per_node_mb", *_CPUS)

# What a column reads that no list answer holds, so it is never asked of the server: a
# job object with more in it (a single job's answer with its spec; Slurm's canceller
# uid) fills it in, and any other reads it as unknown.
LOCAL_ONLY = frozenset({"mem_per_node_mb", "cancelled_by_uid"})

# name -> (width, left-justified, the job object fields the value reads, the value).
# Widths are sacct 22.05's defaults. The value takes `now` (epoch seconds), the row's
# `step` and then each of those fields' values in that order (times as epoch seconds):
# it can read nothing else, so sacct asks the API for those fields only (`fields_for`);
# tests/scheduler/slurm/test_projection.py checks each column prints the same from jobs
# cut to them.
FIELDS: dict[str, tuple[int, bool, tuple[str, ...], Callable[..., str] | Rowwise]] = {
    "JobID": (12, True, _ID, Rowwise(_job_ids)),
    "JobIDRaw": (12, True, ("job_id",), Rowwise(_raw_ids)),
    "JobName": (10, False, ("name",), Rowwise(_names)),
    "Partition": (10, False, ("partition",), _on_job_row(_text)),
    "Account": (10, False, ("account",), lambda now, step, v: _text(v)),
    "AllocCPUS": (10, False, _CPUS, Rowwise(_cpu_counts)),
    "NCPUS": (10, False, _CPUS, Rowwise(_cpu_counts)),
    "AllocNodes": (10, False, _NODES, lambda now, step, *n: str(_nnodes(step, *n))),
    "NNodes": (8, False, _NODES, lambda now, step, *n: str(_nnodes(step, *n))),
    "State": (10, False, ("state", "cancelled_by_uid"), _state),
    "ExitCode": (
        8,
        False,
        ("state", "exit_code", "signal"),
        lambda now, step, state, code, sig: exit_code_text(
            _text(state), code, sig, step=step is not None
        ),
    ),
    "DerivedExitCode": (15, False, (), lambda now, step: "" if step else "0:0"),
    "NodeList": (15, False, ("nodes",), _nodelist),
    "Elapsed": (
        10,
        False,
        _RAN,
        lambda now, step, start, end: format_duration(_elapsed(now, start, end)),
    ),
    "ElapsedRaw": (
        10,
        False,
        _RAN,
        lambda now, step, start, end: str(int(_elapsed(now, start, end))),
    ),
    "Start": (
        19,
        False,
        ("state", "start_time"),
        lambda now, step, state, start: _stamp(
            start, "None" if _text(state) in TERMINAL else "Unknown"
        ),
    ),
    "End": (19, False, ("end_time",), lambda now, step, end: _stamp(end, "Unknown")),
    "Submit": (
        19,
        False,
        ("start_time", "submit_time"),
        lambda now, step, start, submit: _stamp(start if step else submit, "Unknown"),
    ),
    "Eligible": (
        19,
        False,
        ("eligible_time",),
        lambda now, step, eligible: _stamp(eligible, "Unknown"),
    ),
    "Timelimit": (10, False, ("time_limit_min",), _on_job_row(format_sacct_limit)),
    "ReqTRES": (10, False, _TRES, lambda now, step, *job: _tres(now, step, False, *job)),
    "AllocTRES": (10, False, _TRES, lambda now, step, *job: _tres(now, step, True, *job)),
    "User": (9, False, ("user",), _on_job_row(_text)),
    "QOS": (10, False, ("qos",), _on_job_row(lambda v: str(v or "normal"))),
    "Comment": (15, False, ("comment",), _on_job_row(lambda v: str(v or ""))),
    "Reason": (20, False, ("reason",), _on_job_row(lambda v: str(v or "None"))),
    "WorkDir": (15, False, ("workdir",), _on_job_row(_text)),
}
_BY_LOWER = {name.lower(): name for name in FIELDS}


class Column:
    """A column sacct prints: its field's name, width and justification."""

    __slots__ = ("left", "name", "width")

    def __init__(self, name: str, width: int, left: bool) -> None:
        self.name, self.width, self.left = name, width, left

    def __repr__(self) -> str:
        return f"Column({self.name!r}, {self.width}, {self.left})"


def parse_fields(text: str) -> list[Column]:
    """`JobID,JobName%30,state` -> columns. ValueError names an unknown field."""
    columns: list[Column] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, percent, width_text = item.partition("%")
        canonical = _BY_LOWER.get(name.lower())
        if canonical is None:
            raise ValueError(f'Invalid field requested: "{name}"')
        width, left, _, _ = FIELDS[canonical]
        if percent:
            try:
                width = int(width_text)
            except ValueError as exc:
                raise ValueError(f'Invalid field requested: "{item}"') from exc
            # A width given by the user right-justifies every field, as in sacct.
            left = width < 0
            width = abs(width)
        columns.append(Column(canonical, width, left))
    return columns


# What sacct itself reads to choose the jobs and make their rows (`select`, `rows_of`),
# whatever the columns; the steps only where their rows are shown.
SELECTION = (*_ID, "state", "name", "user", "account", "partition", "start_time", "interactive")
STEP_FIELDS = ("steps", "allocation")


def fields_for(columns: Iterable[Column], *, allocations_only: bool) -> list[str]:
    """The job object fields that sacct needs to print `columns`."""
    wanted = set(SELECTION) | (set() if allocations_only else set(STEP_FIELDS))
    for column in columns:
        wanted.update(FIELDS[column.name][2])
    return sorted(wanted - LOCAL_ONLY)


class Rows:
    """The rows sacct prints, as parallel lists: each row's job (its index in the
    columns) and its `step` (None, "batch", or a job step's id); and, by row, what a job
    step's row has of its own (`views`: name, state, exit, nodes, CPUs, times), the
    few rows that have one."""

    __slots__ = ("jobs", "steps", "views")

    def __init__(self) -> None:
        self.jobs: list[int] = []
        self.steps: list[str | None] = []
        self.views: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: int, step: str | None, view: dict[str, Any] | None = None) -> None:
        if view is not None:
            self.views[len(self.jobs)] = view
        self.jobs.append(job)
        self.steps.append(step)

    def only(self, keep: Iterable[int]) -> Rows:
        out = Rows()
        for i in keep:
            out.add(self.jobs[i], self.steps[i], self.views.get(i))
        return out


def rows_of(cols: Columns, jobs: Iterable[int], *, allocations_only: bool) -> Rows:
    """Each of `jobs` (indexes into `cols`) in id order, followed by its batch step once
    it has started (unless srun or salloc made it: they have none, as in Slurm), then
    its job steps (`N.0`, `N.1`, ...)."""
    ids = cols["job_id"]
    rows = Rows()
    ordered = sorted(jobs, key=ids.__getitem__)
    if allocations_only:
        rows.jobs, rows.steps = ordered, [None] * len(ordered)
        return rows
    started, interactive, steps = cols["start_time"], cols["interactive"], cols["steps"]
    add_job, add_step = rows.jobs.append, rows.steps.append
    for j in ordered:
        add_job(j)
        add_step(None)
        if started[j] is not None and not interactive[j]:
            add_job(j)
            add_step("batch")
        for step in steps[j] or ():
            if isinstance(step, dict):
                rows.add(j, str(step.get("step_id")), _step_view(cols, j, step))
    return rows


def _step_view(cols: Columns, job: int, step: Mapping[str, Any]) -> dict[str, Any]:
    nodes = step.get("nodes") or ()
    allocation = cols["allocation"][job] or {}
    return {
        **{key: step.get(key) for key in ("name", "state", "exit_code", "signal", "nodes")},
        "start_time": step.get("start_time"),  # epoch seconds, as the columns' own
        "end_time": step.get("end_time"),
        "num_cpus": step.get("cpus", 0),
        "allocation": {n: a for n, a in allocation.items() if n in nodes},
    }


def _cut(value: str, width: int) -> str:
    """sacct's fixed columns mark a value cut to fit with `+` in its last place."""
    return value if len(value) <= width else value[: width - 1] + "+"


def _source(
    cols: Columns, rows: Rows, name: str, stepped: Sequence[int], seen: dict[int, Any]
) -> list[Any]:
    """One field's value on each row: its job's, or its job step's own (the `stepped`
    rows) where the step has one. A field no answer holds reads as unknown (None). A
    field of one value throughout has that value as its distinct values (`seen`)."""
    column = cols.get(name)
    if column is None:
        one, values = True, [None] * len(rows)
    elif column and column.count(column[0]) == len(column):
        one, values = True, [column[0]] * len(rows)
    else:
        one, values = False, list(map(column.__getitem__, rows.jobs))
    for i in stepped:
        view = rows.views[i]
        if name in view:
            values[i] = view[name]
            one = False
    if one and rows and not isinstance(values[0], list | dict):  # (a list: `texts` keys it)
        seen_one(values, seen)
    return values


def format_rows(
    cols: Columns,
    rows: Rows,
    columns: list[Column],
    *,
    now: float,
    header: bool = True,
    parsable: str = "",
    delimiter: str = "|",
) -> list[str]:
    """sacct's lines. `parsable` is "" (fixed columns), "p" (`-p`) or "P" (`-P`).

    A line is made of pieces: a column of values that differ on nearly every row
    (`Rowwise`: ids, names), or a run of neighbouring columns of few values (a state,
    an account), made together, once per distinct values (`columns.texts`); then each
    line by one `%` (or one join) in C."""
    stepped = sorted(rows.views)
    sources: dict[str, list[Any]] = {}
    seen: dict[int, Any] = {}  # each source's distinct values, found once (`texts`)
    pieces: list[list[str]] = []
    specs: list[str] = []  # each piece's place in the fixed layout's `%` format
    run: list[tuple[Column, Callable[..., str], tuple[str, ...]]] = []

    def end_run() -> None:
        if run:
            pieces.append(_run_texts(run, rows, sources, seen, now, parsable, delimiter))
            specs.append("%s")
            run.clear()

    for column in columns:
        _, _, reads, value = FIELDS[column.name]
        for name in reads:
            if name not in sources:
                sources[name] = _source(cols, rows, name, stepped, seen)
        if not isinstance(value, Rowwise):
            run.append((column, value, reads))
            continue
        end_run()
        values = value.fn(now, rows.steps, *(sources[n] for n in reads))
        pieces.append(values if parsable else _cut_all(values, column.width))
        specs.append(f"%{'-' if column.left else ''}{max(column.width, 0)}s ")
    end_run()
    lines: list[str] = []
    names = [c.name for c in columns]
    if parsable:
        end = delimiter if parsable == "p" else ""
        if header:
            lines.append(delimiter.join(names) + end)
        lines.extend(delimiter.join(line) + end for line in zip(*pieces, strict=True))
        return lines
    if header:
        lines.append("".join(_fixed_text(n, c) for n, c in zip(names, columns, strict=True)))
        lines.append("".join("-" * c.width + " " for c in columns))
    lines.extend(map("".join(specs).__mod__, zip(*pieces, strict=True)))
    return lines


def _run_texts(
    run: Sequence[tuple[Column, Callable[..., str], tuple[str, ...]]],
    rows: Rows,
    sources: Mapping[str, list[Any]],
    seen: dict[int, Any],
    now: float,
    parsable: str,
    delimiter: str,
) -> list[str]:
    """The cells of neighbouring columns of few values, as one piece of each row: each
    cut and padded (or, parsable, joined by the delimiter), made once per distinct
    values of all they read."""
    parts: list[tuple[Callable[..., str], int, int]] = []
    reads: list[str] = []
    for column, value, column_reads in run:
        part = value if parsable else _fixed(value, column.width, column.left)
        parts.append((part, len(reads), len(reads) + len(column_reads)))
        reads.extend(column_reads)
    joiner = delimiter if parsable else ""

    def cell(now: float, step: str | None, *values: Any) -> str:
        return joiner.join([part(now, step, *values[a:b]) for part, a, b in parts])

    return texts(cell, [rows.steps, *(sources[n] for n in reads)], range(len(rows)), now, seen=seen)


def _fixed_text(text: str, column: Column) -> str:
    return _fixed(lambda: text, column.width, column.left)()


def _fixed(value: Callable[..., str], width: int, left: bool) -> Callable[..., str]:
    """A column's cell in the fixed layout: the value cut (with `+`) and padded, then the
    space after it."""
    if width <= 0:
        return lambda *args: _cut(value(*args), width) + " "
    pad = f"{{:{'<' if left else '>'}{width}}} ".format
    return lambda *args: pad(_cut(value(*args), width))


def _cut_all(values: list[str], width: int) -> list[str]:
    """`_cut` of a whole column of values: only those too long for the column (`N.batch`
    in JobID's 12 places) are cut, one by one; the others are the column as it is."""
    if max(map(len, values), default=0) <= width:
        return values
    out = list(values)
    cut = width - 1
    for i in compress(range(len(values)), map(width.__lt__, map(len, values))):
        out[i] = values[i][:cut] + "+" if cut >= 0 else _cut(values[i], width)
    return out
