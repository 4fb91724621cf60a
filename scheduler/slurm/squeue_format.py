"""squeue's output: `-o/--format` letters, `-O/--Format` names, the default layout and
Slurm's default order, from the web API's job objects (times as ISO 8601 strings)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from scheduler.core.contract import JobState
from scheduler.slurm import states
from scheduler.slurm.columns import Field, Piece, parse_percent_format, render
from scheduler.slurm.filenames import DEFAULT_OUTPUT, expand_output, resolve
from scheduler.slurm.hostlist import compress
from scheduler.slurm.jobref import display_id
from scheduler.slurm.timefmt import (
    RUN_FIELDS,
    format_elapsed,
    format_limit,
    format_timestamp,
    parse_iso,
    run_seconds,
)

Job = Mapping[str, Any]

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
DEFAULT_LONG_WIDTH = 20

# squeue prints the reason instead of the nodes for jobs that have none to show.
_REASON_STATES = frozenset(
    {JobState.PENDING, JobState.TIMEOUT, JobState.FAILED, JobState.OUT_OF_MEMORY, "DEADLINE"}
)  # DEADLINE: Slurm's only (states.SLURM_ONLY)


def _nodes(job: Job) -> str:
    return compress(job.get("nodes") or [])


def _spec(job: Job) -> Mapping[str, Any]:
    spec = job.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _used_seconds(job: Job, now: datetime) -> float:
    return run_seconds(job, now)


def _time_left(job: Job, now: datetime) -> str:
    limit = job.get("time_limit_min")
    if limit is None:
        return "UNLIMITED"
    return format_elapsed(max(limit * 60 - _used_seconds(job, now), 0))


def _stamp(value: str | None, missing: str = "N/A") -> str:
    moment = parse_iso(value)
    return format_timestamp(moment) if moment is not None else missing


def _end_time(job: Job, now: datetime) -> str:
    if job.get("end_time"):
        return _stamp(job.get("end_time"))
    start = parse_iso(job.get("start_time"))
    limit = job.get("time_limit_min")
    if start is not None and limit is not None:
        # The time it spent suspended moves its end on (its limit counts running time).
        ran_until = start + timedelta(seconds=float(job.get("suspended_s") or 0))
        return format_timestamp(ran_until + timedelta(minutes=limit))
    return "N/A"


def _reason_list(job: Job) -> str:
    if str(job.get("state", "")).upper() in _REASON_STATES:
        return f"({job.get('reason') or 'None'})"
    return _nodes(job)


def _gpus_per_node(job: Job) -> str:
    # The job's GPUs in all, from its request (the contract's one derivation), are the
    # same on each of its nodes.
    per_node = int(job.get("num_gpus") or 0) // max(int(job.get("num_nodes") or 1), 1)
    if not per_node:
        return "N/A"
    gpu_type = str(_spec(job).get("gpu_type") or job.get("gpu_type") or "")
    return f"gres:gpu:{gpu_type}:{per_node}" if gpu_type else f"gres:gpu:{per_node}"


def _comment(job: Job) -> str:
    return str(job.get("comment") or _spec(job).get("comment") or "(null)")


def _std_path(job: Job, key: str) -> str:
    pattern = str(job.get(key) or "")
    if key == "stderr" and not pattern:
        pattern = str(job.get("stdout") or "")
    if key == "stdin" and not pattern:
        return "/dev/null"
    pattern = pattern or DEFAULT_OUTPUT
    nodes = job.get("nodes") or []
    path = expand_output(
        pattern,
        job_id=int(job["job_id"]),
        name=str(job.get("name", "")),
        user=str(job.get("user", "")),
        node=nodes[0] if nodes else "",
    )
    return resolve(path, str(job.get("workdir") or "/"))


Getter = Callable[[Job, datetime], str]


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


# What columns read of a job besides their own fields: the id as shown, how long it ran,
# and what an output path's patterns fill in.
_ID = ("job_id", "array_job_id", "array_task_id")
_RAN = RUN_FIELDS
_PATH = ("job_id", "name", "user", "nodes", "workdir")

# key -> (header, value, the job object fields the value reads). squeue asks the API for
# those fields only (`fields_for`); tests/scheduler/slurm/test_projection.py checks that
# each value is the same from a job cut to them.
FIELDS: dict[str, tuple[str, Getter, tuple[str, ...]]] = {
    "jobid": ("JOBID", lambda j, n: display_id(j), _ID),
    "jobid_raw": ("JOBID", lambda j, n: str(j["job_id"]), ("job_id",)),
    "array_job_id": (
        "ARRAY_JOB_ID",
        lambda j, n: str(_or(j.get("array_job_id"), j["job_id"])),
        ("array_job_id",),
    ),
    "array_task_id": (
        "ARRAY_TASK_ID",
        lambda j, n: str(_or(j.get("array_task_id"), "N/A")),
        ("array_task_id",),
    ),
    "name": ("NAME", lambda j, n: str(j.get("name", "")), ("name",)),
    "user": ("USER", lambda j, n: str(j.get("user", "")), ("user",)),
    "account": ("ACCOUNT", lambda j, n: str(j.get("account", "")), ("account",)),
    "qos": ("QOS", lambda j, n: str(j.get("qos") or "normal"), ("qos",)),
    "partition": ("PARTITION", lambda j, n: str(j.get("partition", "")), ("partition",)),
    "state_compact": ("ST", lambda j, n: states.compact(str(j.get("state", ""))), ("state",)),
    "state": ("STATE", lambda j, n: str(j.get("state", "")), ("state",)),
    "time_used": ("TIME", lambda j, n: format_elapsed(_used_seconds(j, n)), _RAN),
    "time_limit": (
        "TIME_LIMIT",
        lambda j, n: format_limit(j.get("time_limit_min")),
        ("time_limit_min",),
    ),
    "time_left": ("TIME_LEFT", _time_left, ("time_limit_min", *_RAN)),
    "num_nodes": ("NODES", lambda j, n: str(j.get("num_nodes", 0)), ("num_nodes",)),
    "num_cpus": ("CPUS", lambda j, n: str(j.get("num_cpus", 0)), ("num_cpus",)),
    "nodelist": ("NODELIST", lambda j, n: _nodes(j), ("nodes",)),
    "reason_list": ("NODELIST(REASON)", lambda j, n: _reason_list(j), ("state", "reason", "nodes")),
    "reason": ("REASON", lambda j, n: str(j.get("reason") or "None"), ("reason",)),
    "exec_host": ("EXEC_HOST", lambda j, n: (j.get("nodes") or ["n/a"])[0], ("nodes",)),
    "tres_per_node": (
        "TRES_PER_NODE",
        lambda j, n: _gpus_per_node(j),
        ("num_gpus", "num_nodes", "gpu_type"),
    ),
    "start_time": ("START_TIME", lambda j, n: _stamp(j.get("start_time")), ("start_time",)),
    "submit_time": ("SUBMIT_TIME", lambda j, n: _stamp(j.get("submit_time")), ("submit_time",)),
    "end_time": ("END_TIME", _end_time, ("time_limit_min", *_RAN)),
    "priority": ("PRIORITY", lambda j, n: str(j.get("priority", 0)), ("priority",)),
    "dependency": (
        "DEPENDENCY",
        lambda j, n: str(j.get("dependency") or "(null)"),
        ("dependency",),
    ),
    "comment": ("COMMENT", lambda j, n: _comment(j), ("comment",)),
    "work_dir": ("WORK_DIR", lambda j, n: str(j.get("workdir", "")), ("workdir",)),
    "stdout": ("STDOUT", lambda j, n: _std_path(j, "stdout"), ("stdout", *_PATH)),
    "stderr": ("STDERR", lambda j, n: _std_path(j, "stderr"), ("stderr", "stdout", *_PATH)),
    "stdin": ("STDIN", lambda j, n: _std_path(j, "stdin"), ()),
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

_LONG_RE = re.compile(r"^(\.)?(\d+)?(.*)$")


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
        match = _LONG_RE.match(rest)
        assert match is not None  # the pattern matches any string
        dot, width, suffix = match.groups()
        pieces.append(
            Field(
                key,
                width=int(width) if width else DEFAULT_LONG_WIDTH,
                right=dot is not None,
                suffix=suffix,
            )
        )
    return pieces


def sort_jobs(jobs: Iterable[Job]) -> list[Job]:
    """squeue's default order (`P,t,-p`): partition, state, then priority high to low;
    Spur's priority is first come first served, so the job id stands in for it."""
    return sorted(
        jobs,
        key=lambda j: (
            str(j.get("partition", "")),
            states.ORDER.get(str(j.get("state", "")), 99),
            -int(j.get("priority", 0) or 0),
            int(j["job_id"]),
        ),
    )


# What squeue itself reads to choose, order and group the lines (select_jobs, sort_jobs,
# collapse_pending), whatever the columns.
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


def fields_for(pieces: Iterable[Piece]) -> list[str]:
    """The job object fields that squeue needs to print `pieces`."""
    wanted = set(SELECTION)
    for piece in pieces:
        if isinstance(piece, Field):
            wanted.update(FIELDS[piece.key][2])
    return sorted(wanted)


def format_jobs(
    jobs: Iterable[Job], pieces: list[Piece], *, now: datetime, header: bool = True
) -> list[str]:
    """The lines squeue prints for `jobs`, in the order given."""
    keys = {p.key for p in pieces if isinstance(p, Field)}
    getters = [(key, FIELDS[key][1]) for key in keys]
    rows = [{key: value(job, now) for key, value in getters} for job in jobs]
    headers = {key: FIELDS[key][0] for key in keys}
    return render(pieces, rows, headers, header=header)
