"""squeue's output: `-o/--format` letters, `-O/--Format` names, the default layout and
Slurm's default order.

squeue reads the queue as columns (`GET /api/v1/queue?shape=columns`: a list per job
field, times in epoch seconds) and prints it a column at a time: each column's text is
a function of the job fields it reads (`FIELDS`), computed once per distinct value
(`columns.texts`). Ten thousand pending jobs hold a handful of distinct states, reasons
and times, so a long queue costs little more to print than its ids. `format_jobs` and
`sort_jobs` take job objects (the rows answer, ISO times) for the callers that have
those, through the same columns.
"""

from __future__ import annotations

import math

from scheduler.core.contract import JobState
from scheduler.slurm import states
from scheduler.slurm.columns import (
    Field,
    padder,
    parse_percent_format,
    render_columns,
    texts,
)
from scheduler.slurm.filenames import DEFAULT_OUTPUT, expand_output, resolve
from scheduler.slurm.timefmt import (
    RUN_FIELDS,
    format_elapsed,
    format_epoch,
    format_limit,
    run_seconds_of,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import datetime
    from typing import Any

    from scheduler.slurm.columns import Piece

    Job = Mapping[str, Any]
    Columns = Mapping[str, Sequence[Any]]

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"  # --start (squeue -v says so)
DEFAULT_LONG_WIDTH = 20

# squeue prints the reason instead of the nodes for jobs that have none to show.
_REASON_STATES = frozenset(
    {JobState.PENDING, JobState.TIMEOUT, JobState.FAILED, JobState.OUT_OF_MEMORY, "DEADLINE"}
)  # DEADLINE: Slurm's only (states.SLURM_ONLY)


def _nodes(nodes: Sequence[str] | None) -> str:
    if not nodes:
        return ""
    from scheduler.slurm.hostlist import compress  # only when a job holds nodes

    return compress(nodes)


def _text(value: Any, default: str = "") -> str:
    return default if value is None else str(value)


def _time_used(now: float, start: Any, end: Any, suspended_at: Any, suspended_s: Any) -> str:
    return format_elapsed(run_seconds_of(start, end, suspended_at, suspended_s, now))


def _time_left(
    now: float, limit: int | None, start: Any, end: Any, suspended_at: Any, suspended_s: Any
) -> str:
    if limit is None:
        return "UNLIMITED"
    ran = run_seconds_of(start, end, suspended_at, suspended_s, now)
    return format_elapsed(max(limit * 60 - ran, 0))


def _stamp(value: float | None) -> str:
    return "N/A" if value is None else format_epoch(value)


def _start_time(now: float, start: float | None, expected: float | None) -> str:
    """When it started, or for a pending job when it is expected to (N/A: unknown)."""
    return _stamp(start if start is not None else expected)


def _end_time(
    now: float,
    limit: int | None,
    start: float | None,
    end: float | None,
    suspended_at: float | None,
    suspended_s: float | None,
    expected: float | None,
) -> str:
    if end is not None:
        return format_epoch(end)
    if start is not None and limit is not None:
        # The time it spent suspended moves its end on (its limit counts running time).
        return format_epoch(start + float(suspended_s or 0) + limit * 60)
    if start is None and expected is not None:
        # A pending job expected to start: then its limit runs out, if it has one.
        return "NONE" if limit is None else format_epoch(expected + limit * 60)
    return "N/A"


def _sched_nodes(now: float, nodes: Sequence[str] | None) -> str:
    return _nodes(nodes) or "(null)"


def _reason_list(now: float, state: Any, reason: Any, nodes: Sequence[str] | None) -> str:
    if str(state or "").upper() in _REASON_STATES:
        return f"({reason or 'None'})"
    return _nodes(nodes)


def _gpus_per_node(now: float, num_gpus: Any, num_nodes: Any, gpu_type: Any) -> str:
    # The job's GPUs in all, from its request (the contract's one derivation), are the
    # same on each of its nodes.
    per_node = int(num_gpus or 0) // max(int(num_nodes or 1), 1)
    if not per_node:
        return "N/A"
    return f"gres:gpu:{gpu_type}:{per_node}" if gpu_type else f"gres:gpu:{per_node}"


def _std_path(
    key: str,
    pattern: Any,
    fallback: Any,
    job_id: int,
    name: Any,
    user: Any,
    nodes: Sequence[str] | None,
    workdir: Any,
) -> str:
    text = str(pattern or "")
    if key == "stderr" and not text:
        text = str(fallback or "")
    path = expand_output(
        text or DEFAULT_OUTPUT,
        job_id=int(job_id),
        name=_text(name),
        user=_text(user),
        node=nodes[0] if nodes else "",
    )
    return resolve(path, str(workdir or "/"))


# What columns read of a job besides their own fields: the id as shown, how long it ran,
# and what an output path's patterns fill in.
_ID = ("job_id", "array_job_id", "array_task_id")
_RAN = RUN_FIELDS  # start_time, end_time, suspended_at, suspended_s
_PATH = ("job_id", "name", "user", "nodes", "workdir")

# key -> (header, the job object fields the value reads, the value). The value takes
# `now` (epoch seconds) and then each of those fields' values, in that order, times as
# epoch seconds: it can read nothing else, so squeue asks the API for those fields only
# (`fields_for`), and tests/scheduler/slurm/test_projection.py checks each value is the
# same from a job cut to them.
FIELDS: dict[str, tuple[str, tuple[str, ...], Callable[..., str]]] = {
    "jobid": ("JOBID", _ID, lambda n, i, a, t: str(i) if a is None else f"{a}_{t}"),
    "jobid_raw": ("JOBID", ("job_id",), lambda n, i: str(i)),
    "array_job_id": (
        "ARRAY_JOB_ID",
        ("array_job_id", "job_id"),
        lambda n, a, i: str(i if a is None else a),
    ),
    "array_task_id": ("ARRAY_TASK_ID", ("array_task_id",), lambda n, t: _text(t, "N/A")),
    "name": ("NAME", ("name",), lambda n, v: _text(v)),
    "user": ("USER", ("user",), lambda n, v: _text(v)),
    "account": ("ACCOUNT", ("account",), lambda n, v: _text(v)),
    "qos": ("QOS", ("qos",), lambda n, v: str(v or "normal")),
    "partition": ("PARTITION", ("partition",), lambda n, v: _text(v)),
    "state_compact": ("ST", ("state",), lambda n, v: states.compact(str(v or ""))),
    "state": ("STATE", ("state",), lambda n, v: _text(v)),
    "time_used": ("TIME", _RAN, _time_used),
    "time_limit": ("TIME_LIMIT", ("time_limit_min",), lambda n, v: format_limit(v)),
    "time_left": ("TIME_LEFT", ("time_limit_min", *_RAN), _time_left),
    "num_nodes": ("NODES", ("num_nodes",), lambda n, v: _text(v, "0")),
    "num_cpus": ("CPUS", ("num_cpus",), lambda n, v: _text(v, "0")),
    "nodelist": ("NODELIST", ("nodes",), lambda n, v: _nodes(v)),
    "reason_list": ("NODELIST(REASON)", ("state", "reason", "nodes"), _reason_list),
    "reason": ("REASON", ("reason",), lambda n, v: str(v or "None")),
    "exec_host": ("EXEC_HOST", ("nodes",), lambda n, v: str(v[0]) if v else "n/a"),
    "tres_per_node": ("TRES_PER_NODE", ("num_gpus", "num_nodes", "gpu_type"), _gpus_per_node),
    "start_time": ("START_TIME", ("start_time", "expected_start"), _start_time),
    "submit_time": ("SUBMIT_TIME", ("submit_time",), lambda n, v: _stamp(v)),
    "end_time": ("END_TIME", ("time_limit_min", *_RAN, "expected_start"), _end_time),
    "sched_nodes": ("SCHEDNODES", ("sched_nodes",), _sched_nodes),
    "priority": ("PRIORITY", ("priority",), lambda n, v: _text(v, "0")),
    "dependency": ("DEPENDENCY", ("dependency",), lambda n, v: str(v or "(null)")),
    "comment": ("COMMENT", ("comment",), lambda n, v: str(v or "(null)")),
    "work_dir": ("WORK_DIR", ("workdir",), lambda n, v: _text(v)),
    "stdout": (
        "STDOUT",
        ("stdout", *_PATH),
        lambda n, pattern, *job: _std_path("stdout", pattern, "", *job),
    ),
    "stderr": (
        "STDERR",
        ("stderr", "stdout", *_PATH),
        lambda n, pattern, fallback, *job: _std_path("stderr", pattern, fallback, *job),
    ),
    # Spur takes no --input for a batch job: its stdin is always /dev/null.
    "stdin": ("STDIN", (), lambda n: "/dev/null"),
}

LETTERS: dict[str, str] = {
    "i": "jobid",
    "A": "jobid_raw",
    "F": "array_job_id",
    "K": "array_task_id",
    "j": "name",
    "u": "user",
    "a": "account",
    "q": "qos",
    "P": "partition",
    "t": "state_compact",
    "T": "state",
    "M": "time_used",
    "l": "time_limit",
    "L": "time_left",
    "D": "num_nodes",
    "C": "num_cpus",
    "N": "nodelist",
    "R": "reason_list",
    "r": "reason",
    "B": "exec_host",
    "b": "tres_per_node",
    "S": "start_time",
    "Y": "sched_nodes",
    "V": "submit_time",
    "e": "end_time",
    "Q": "priority",
    "E": "dependency",
    "k": "comment",
    "Z": "work_dir",
}

# -O names (lower case) -> key
NAMES: dict[str, str] = {
    "jobid": "jobid_raw",  # squeue -O JobID prints the raw id even for array tasks
    "jobarrayid": "jobid",
    "arrayjobid": "array_job_id",
    "arraytaskid": "array_task_id",
    "name": "name",
    "username": "user",
    "account": "account",
    "qos": "qos",
    "partition": "partition",
    "statecompact": "state_compact",
    "state": "state",
    "timeused": "time_used",
    "timelimit": "time_limit",
    "timeleft": "time_left",
    "numnodes": "num_nodes",
    "numcpus": "num_cpus",
    "nodelist": "nodelist",
    "reasonlist": "reason_list",
    "reason": "reason",
    "batchhost": "exec_host",
    "tres-per-node": "tres_per_node",
    "starttime": "start_time",
    "schednodes": "sched_nodes",
    "submittime": "submit_time",
    "endtime": "end_time",
    "priority": "priority",
    "dependency": "dependency",
    "comment": "comment",
    "workdir": "work_dir",
    "stdout": "stdout",
    "stderr": "stderr",
    "stdin": "stdin",
}


def parse_format(fmt: str) -> list[Piece]:
    """A `-o` format, letters turned into field keys. ValueError for unknown letters."""
    try:
        pieces = parse_percent_format(fmt, set(LETTERS))
    except ValueError as exc:
        raise ValueError(f"Invalid job format specification: {exc}") from exc
    return [
        p if isinstance(p, str) else Field(LETTERS[p.key], p.width, p.right, p.fit) for p in pieces
    ]


def parse_long_format(fmt: str) -> list[Piece]:
    """A `-O` format: `Name[:[.][width][suffix]],...`, 20 columns wide by default."""
    pieces: list[Piece] = []
    for item in fmt.split(","):
        if not item.strip():
            continue
        name, _, rest = item.strip().partition(":")
        key = NAMES.get(name.lower())
        if key is None:
            raise ValueError(f"Invalid job format specification: {name}")
        # `[.][width][suffix]`, read by hand as columns.py reads `%.18i`: without `re`.
        right = rest.startswith(".")
        start = end = int(right)
        while end < len(rest) and rest[end].isdecimal():
            end += 1
        width = int(rest[start:end]) if end > start else DEFAULT_LONG_WIDTH
        pieces.append(Field(key, width=width, right=right, suffix=rest[end:]))
    return pieces


# What squeue itself reads to choose, order and group the lines (`select`, `order`,
# `collapse`), whatever the columns.
SELECTION = (
    *_ID,
    "state",
    "partition",
    "priority",
    "user",
    "name",
    "account",
    "qos",
    "array_throttle",
)


# What `--start` orders by besides (`order_by_start`).
START_ORDER = ("start_time", "expected_start")


def fields_for(pieces: Iterable[Piece], *, by_start: bool = False) -> list[str]:
    """The job object fields that squeue needs to print `pieces` (in `--start`'s order
    where `by_start`)."""
    wanted = set(SELECTION) | (set(START_ORDER) if by_start else set())
    for piece in pieces:
        if isinstance(piece, Field):
            wanted.update(FIELDS[piece.key][1])
    return sorted(wanted)


def order(cols: Columns, rows: Iterable[int]) -> list[int]:
    """squeue's default order (`P,t,-p`): partition, state, then priority high to low,
    then the job id. A stable sort a key at a time, the last key first, each key a list
    looked up in C: a key that one value holds throughout (one partition, one state over
    10,000 pending jobs) orders nothing and is not sorted by."""
    rank = states.ORDER.get
    keys = (
        (cols["job_id"], None),
        (cols["priority"], lambda p: -int(p or 0)),
        (cols["state"], lambda s: rank(s, 99)),
        (cols["partition"], _text),
    )
    ordered = list(rows)
    for column, as_key in keys:
        if not column or column.count(column[0]) == len(column):
            continue
        if as_key is not None:
            memo = {value: as_key(value) for value in dict.fromkeys(column)}
            column = [memo[value] for value in column]
        ordered.sort(key=column.__getitem__)
    return ordered


def order_by_start(cols: Columns, rows: Iterable[int], now: float) -> list[int]:
    """`squeue --start`'s order (its `-S S`): by start time, a pending job's expected one
    (one already due counts as now, as Slurm's sort has it), the jobs with none last;
    then by job id, as Slurm's captures show its ties."""
    started, expected = cols["start_time"], cols["expected_start"]
    pending = JobState.PENDING.value
    state, ids = cols["state"], cols["job_id"]

    def key(i: int) -> tuple[float, int]:
        at = started[i] if started[i] is not None else expected[i]
        if at is None:
            return (math.inf, ids[i])
        return (max(at, now) if state[i] == pending else at, ids[i])

    return sorted(rows, key=key)


def collapse(cols: Columns, rows: Sequence[int]) -> tuple[list[int], dict[int, str]]:
    """squeue without `-r`: the pending tasks of an array as one line, `17_[2-3%2]`,
    standing where the array's first pending task stood. The rows that stay, and the
    id each group's line shows (by its first task's row)."""
    array_ids, tasks, state = cols["array_job_id"], cols["array_task_id"], cols["state"]
    groups: dict[int, list[int]] = {}
    kept: list[int] = []
    for i in rows:
        array_id = array_ids[i]
        if array_id is None or state[i] != JobState.PENDING:
            kept.append(i)
        elif array_id in groups:
            groups[array_id].append(i)
        else:
            groups[array_id] = [i]
            kept.append(i)
    shown: dict[int, str] = {}
    if groups:
        from scheduler.core.arrays import compress

        throttles = cols["array_throttle"]
        for array_id, group in groups.items():
            throttle = int(throttles[group[0]] or 0)
            if len(group) > 1 or throttle:
                limit = f"%{throttle}" if throttle else ""
                listed = compress(int(tasks[i]) for i in group)
                shown[group[0]] = f"{array_id}_[{listed}{limit}]"
    dropped = {i for group in groups.values() for i in group[1:]}
    return [i for i in kept if i not in dropped], shown


def format_columns(
    cols: Columns,
    rows: Sequence[int],
    pieces: list[Piece],
    *,
    now: float,
    header: bool = True,
    shown_ids: Mapping[int, str] | None = None,
) -> list[str]:
    """The lines squeue prints for `rows` (indexes into `cols`, in the order given);
    `shown_ids` replaces the id of a collapsed array's line (`collapse`)."""
    columns: list[Sequence[str] | str] = []
    headers: list[str] = []
    for piece in pieces:
        if isinstance(piece, str):
            columns.append(piece)
            headers.append(piece)
            continue
        title, reads, value = FIELDS[piece.key]
        pad = padder(piece.width, piece.right, piece.suffix)
        cells = texts(_padded(value, pad), [cols[f] for f in reads], rows, now)
        if piece.key == "jobid" and shown_ids:
            cells = [
                pad(shown_ids[i]) if i in shown_ids else c for i, c in zip(rows, cells, strict=True)
            ]
        columns.append(cells)
        headers.append(pad(title))
    return render_columns(columns, headers if header else None, len(rows))


def _padded(value: Callable[..., str], pad: Callable[[str], str]) -> Callable[..., str]:
    return lambda *values: pad(value(*values))


def value_of(key: str, job: Job, now: float) -> str:
    """One column's text for one job object whose times are epoch seconds (a path
    column's job object has none: scontrol prints StdOut as squeue does)."""
    _, reads, value = FIELDS[key]
    return value(now, *(job.get(name) for name in reads))


# What a job object that carries its spec (a single job's answer) may hold there only.
_FROM_SPEC = ("gpu_type", "comment")


def _with_spec(job: Job, name: str) -> Any:
    value = job.get(name)
    if not value and name in _FROM_SPEC and isinstance(job.get("spec"), dict):
        return job["spec"].get(name) or value
    return value


def as_columns(jobs: Sequence[Job]) -> dict[str, list[Any]]:
    """Job objects of the rows answer (ISO 8601 times) as the columns answer holds them:
    the same fields, times in epoch seconds."""
    from scheduler.core.contract.job_object import TIME_FIELDS
    from scheduler.slurm.timefmt import parse_iso

    names = sorted({name for job in jobs for name in job} | set(_FROM_SPEC))
    cols: dict[str, list[Any]] = {}
    for name in names:
        values = [_with_spec(job, name) for job in jobs]
        if name in TIME_FIELDS:
            moments = [parse_iso(v) if isinstance(v, str) else None for v in values]
            values = [None if m is None else int(m.timestamp()) for m in moments]
        cols[name] = values
    for name in (*SELECTION, *(f for _, reads, _ in FIELDS.values() for f in reads)):
        cols.setdefault(name, [None] * len(jobs))
    return cols


def sort_jobs(jobs: Iterable[Job]) -> list[Job]:
    """Job objects in squeue's default order (`order`)."""
    listed = list(jobs)
    return [listed[i] for i in order(as_columns(listed), range(len(listed)))]


def format_jobs(
    jobs: Iterable[Job], pieces: list[Piece], *, now: datetime, header: bool = True
) -> list[str]:
    """The lines squeue prints for job objects (the rows answer), in the order given."""
    listed = list(jobs)
    return format_columns(
        as_columns(listed), range(len(listed)), pieces, now=now.timestamp(), header=header
    )
