"""sacct's output from the web API's job history objects: fixed-width columns with a
`+` where a value is cut, or `|`-separated (`-p`, `-P`), and a `.batch` step row after
every job that started, as Slurm's accounting records one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scheduler.core.contract import JobState
from scheduler.slurm.hostlist import compress
from scheduler.slurm.jobref import display_id
from scheduler.slurm.memfmt import format_mem_mb
from scheduler.slurm.states import TERMINAL, exit_code_text
from scheduler.slurm.timefmt import format_duration, format_sacct_limit, format_timestamp, parse_iso

Job = Mapping[str, Any]

DEFAULT_FIELDS = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF_FIELDS = "JobID,State,ExitCode"
LONG_FIELDS = (
    "JobID,JobIDRaw,JobName,Partition,Account,User,AllocCPUS,NCPUS,NNodes,NodeList,"
    "State,ExitCode,DerivedExitCode,Submit,Start,End,Elapsed,Timelimit,ReqTRES,AllocTRES"
)


@dataclass(frozen=True)
class Record:
    """One sacct row: a job (`step=None`) or its batch step (`step="batch"`)."""

    job: Job
    step: str | None
    now: datetime

    @property
    def is_step(self) -> bool:
        return self.step is not None


def _spec(job: Job) -> Mapping[str, Any]:
    spec = job.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _job_id(r: Record) -> str:
    """`17_3.batch` for a step of an array task, as sacct prints it."""
    shown = display_id(r.job)
    return f"{shown}.{r.step}" if r.step else shown


def _job_id_raw(r: Record) -> str:
    return f"{r.job['job_id']}.{r.step}" if r.step else str(r.job["job_id"])


def _first_node(job: Job) -> str:
    nodes = job.get("nodes") or []
    return str(nodes[0]) if nodes else ""


def _cpus(r: Record) -> int:
    if STEP_CPUS in r.job:
        return int(r.job[STEP_CPUS])
    if not r.is_step:
        return int(r.job.get("num_cpus") or 0)
    allocation = (r.job.get("allocation") or {}).get(_first_node(r.job)) or {}
    if "cpus" in allocation:
        return int(allocation["cpus"])
    return -(-int(r.job.get("num_cpus") or 0) // max(int(r.job.get("num_nodes") or 1), 1))


def _state(r: Record) -> str:
    state = str(r.job.get("state", ""))
    if not r.is_step:
        if state == JobState.CANCELLED:
            return f"CANCELLED by {r.job.get('cancelled_by_uid', 0)}"
        return state
    if state in (JobState.CANCELLED, JobState.TIMEOUT):
        return JobState.CANCELLED.value
    if state == JobState.COMPLETING:
        return JobState.RUNNING.value
    return state


def _exit_code(r: Record) -> str:
    return exit_code_text(
        str(r.job.get("state", "")), r.job.get("exit_code"), r.job.get("signal"), step=r.is_step
    )


def _elapsed_seconds(r: Record) -> float:
    start = parse_iso(r.job.get("start_time"))
    if start is None:
        return 0.0
    end = parse_iso(r.job.get("end_time")) or r.now
    return max((end - start).total_seconds(), 0.0)


def _stamp(value: Any, missing: str) -> str:
    moment = parse_iso(value)
    return format_timestamp(moment) if moment is not None else missing


def _start(r: Record) -> str:
    ended = str(r.job.get("state", "")) in TERMINAL
    return _stamp(r.job.get("start_time"), "None" if ended else "Unknown")


def _nodelist(r: Record) -> str:
    if STEP_CPUS in r.job:
        return compress(r.job.get("nodes") or [])
    if r.is_step:
        return _first_node(r.job)
    return compress(r.job.get("nodes") or []) or "None assigned"


def _tres(r: Record, *, allocated: bool) -> str:
    job = r.job
    if allocated and not job.get("start_time"):
        return ""
    if not allocated and r.is_step:
        return ""
    # A batch step holds the first node; a job step (srun) its own nodes, whole.
    srun_step = STEP_CPUS in job
    nodes = _nnodes(r) if srun_step else 1 if r.is_step else int(job.get("num_nodes") or 1)
    cpus = _cpus(r)
    gpus = int(job.get("num_gpus") or 0)
    if r.is_step and gpus:
        gpus = -(-gpus // max(int(job.get("num_nodes") or 1), 1))
    allocation: Mapping[str, Any] = job.get("allocation") or {}
    if allocated and allocation:
        chosen = [_first_node(job)] if r.is_step and not srun_step else list(allocation)
        per_node = [allocation.get(n) or {} for n in chosen]
        gpus = sum(len(a.get("gpus") or []) for a in per_node)
        mem = sum(int(a.get("mem_mb") or 0) for a in per_node)
    else:
        mem = int(_spec(job).get("mem_per_node_mb") or 0) * nodes
    parts = {"cpu": str(cpus), "node": str(nodes)}
    if not r.is_step:
        parts["billing"] = str(cpus)
    if mem:
        parts["mem"] = format_mem_mb(mem)
    if gpus:
        parts["gres/gpu"] = str(gpus)
        gpu_type = str(job.get("gpu_type") or _spec(job).get("gpu_type") or "")
        if gpu_type:
            parts[f"gres/gpu:{gpu_type}"] = str(gpus)
    # Slurm sorts the `name=count` strings, which puts `gres/gpu:type=` before `gres/gpu=`.
    return ",".join(sorted(f"{k}={v}" for k, v in parts.items()))


Getter = Callable[[Record], str]

# What columns read of a job besides their own fields.
_ID = ("job_id", "array_job_id", "array_task_id")
_NODES = ("nodes", "num_nodes")
_CPUS = ("num_cpus", "allocation", *_NODES)
_RAN = ("start_time", "end_time")
_TRES = ("start_time", "num_gpus", "gpu_type", *_CPUS)

# name -> (width, left-justified, value, the job object fields the value reads); widths
# are sacct 22.05's defaults. sacct asks the API for those fields only (`fields_for`);
# tests/scheduler/slurm/test_projection.py checks each value is the same from a job cut
# to them.
FIELDS: dict[str, tuple[int, bool, Getter, tuple[str, ...]]] = {
    "JobID": (12, True, _job_id, _ID),
    "JobIDRaw": (12, True, _job_id_raw, ("job_id",)),
    "JobName": (
        10,
        False,
        lambda r: "batch" if r.step == "batch" else str(r.job.get("name", "")),
        ("name",),
    ),
    "Partition": (
        10,
        False,
        lambda r: "" if r.is_step else str(r.job.get("partition", "")),
        ("partition",),
    ),
    "Account": (10, False, lambda r: str(r.job.get("account", "")), ("account",)),
    "AllocCPUS": (10, False, lambda r: str(_cpus(r)), _CPUS),
    "NCPUS": (10, False, lambda r: str(_cpus(r)), _CPUS),
    "AllocNodes": (10, False, lambda r: str(_nnodes(r)), _NODES),
    "NNodes": (8, False, lambda r: str(_nnodes(r)), _NODES),
    "State": (10, False, _state, ("state",)),
    "ExitCode": (8, False, _exit_code, ("state", "exit_code", "signal")),
    "DerivedExitCode": (15, False, lambda r: "" if r.is_step else "0:0", ()),
    "NodeList": (15, False, _nodelist, ("nodes",)),
    "Elapsed": (10, False, lambda r: format_duration(_elapsed_seconds(r)), _RAN),
    "ElapsedRaw": (10, False, lambda r: str(int(_elapsed_seconds(r))), _RAN),
    "Start": (19, False, _start, ("state", "start_time")),
    "End": (19, False, lambda r: _stamp(r.job.get("end_time"), "Unknown"), ("end_time",)),
    "Submit": (
        19,
        False,
        lambda r: _stamp(r.job.get("start_time" if r.is_step else "submit_time"), "Unknown"),
        ("start_time", "submit_time"),
    ),
    "Eligible": (
        19,
        False,
        lambda r: _stamp(r.job.get("eligible_time"), "Unknown"),
        ("eligible_time",),
    ),
    "Timelimit": (
        10,
        False,
        lambda r: "" if r.is_step else format_sacct_limit(r.job.get("time_limit_min")),
        ("time_limit_min",),
    ),
    "ReqTRES": (10, False, lambda r: _tres(r, allocated=False), _TRES),
    "AllocTRES": (10, False, lambda r: _tres(r, allocated=True), _TRES),
    "User": (9, False, lambda r: "" if r.is_step else str(r.job.get("user", "")), ("user",)),
    "QOS": (10, False, lambda r: "" if r.is_step else str(r.job.get("qos") or "normal"), ("qos",)),
    "Comment": (
        15,
        False,
        lambda r: (
            "" if r.is_step else str(r.job.get("comment") or _spec(r.job).get("comment") or "")
        ),
        ("comment",),
    ),
    "Reason": (
        20,
        False,
        lambda r: "" if r.is_step else str(r.job.get("reason") or "None"),
        ("reason",),
    ),
    "WorkDir": (
        15,
        False,
        lambda r: "" if r.is_step else str(r.job.get("workdir", "")),
        ("workdir",),
    ),
}
_BY_LOWER = {name.lower(): name for name in FIELDS}


@dataclass(frozen=True)
class Column:
    name: str
    width: int
    left: bool


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


# What sacct itself reads to choose the jobs and make their rows (sacct.select_jobs,
# `records`), whatever the columns; the steps only where their rows are shown.
SELECTION = (*_ID, "state", "name", "user", "account", "partition", "start_time", "interactive")
STEP_FIELDS = ("steps", "allocation")


def fields_for(columns: Iterable[Column], *, allocations_only: bool) -> list[str]:
    """The job object fields that sacct needs to print `columns`."""
    wanted = set(SELECTION) | (set() if allocations_only else set(STEP_FIELDS))
    for column in columns:
        wanted.update(FIELDS[column.name][3])
    return sorted(wanted)


def records(jobs: Iterable[Job], *, now: datetime, allocations_only: bool) -> list[Record]:
    """Jobs in id order, each followed by its batch step once it has started, then its
    job steps (srun: `N.0`, `N.1`, ...)."""
    out: list[Record] = []
    for job in sorted(jobs, key=lambda j: int(j["job_id"])):
        out.append(Record(job, None, now))
        if allocations_only:
            continue
        if job.get("start_time") and _has_batch(job):
            out.append(Record(job, "batch", now))
        out.extend(step_records(job, now))
    return out


# -- job steps (srun): each shown from its own entry of the job object's `steps` -----------

STEP_CPUS = "_step_cpus"  # marks a step's row: its CPUs, from the step itself


def _has_batch(job: Job) -> bool:
    """A job made by srun or salloc outside an allocation has no batch step (Slurm shows
    `N.0` alone for `srun hostname`)."""
    return not (job.get("interactive") or _spec(job).get("interactive"))


def _nnodes(r: Record) -> int:
    if STEP_CPUS in r.job:
        return len(r.job.get("nodes") or [])
    return 1 if r.is_step else int(r.job.get("num_nodes", 0) or 0)


def step_records(job: Job, now: datetime) -> list[Record]:
    out = []
    for step in job.get("steps") or ():
        if not isinstance(step, Mapping):
            continue
        view = dict(job)
        for key in ("name", "state", "exit_code", "signal", "nodes"):
            view[key] = step.get(key)
        for key in ("start_time", "end_time"):  # epoch seconds in the job object's steps
            value = step.get(key)
            view[key] = (
                datetime.fromtimestamp(float(value), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                if isinstance(value, int | float)
                else value
            )
        view[STEP_CPUS] = step.get("cpus", 0)
        view["allocation"] = {
            n: a for n, a in (job.get("allocation") or {}).items() if n in (step.get("nodes") or ())
        }
        out.append(Record(view, str(step.get("step_id")), now))
    return out


def _cut(value: str, width: int) -> str:
    """sacct's fixed columns mark a value cut to fit with `+` in its last place."""
    return value if len(value) <= width else value[: width - 1] + "+"


def format_sacct(
    rows: Iterable[Record],
    columns: list[Column],
    *,
    header: bool = True,
    parsable: str = "",
    delimiter: str = "|",
) -> list[str]:
    """sacct's lines. `parsable` is "" (fixed columns), "p" (`-p`) or "P" (`-P`)."""
    getters = [FIELDS[c.name][2] for c in columns]
    values = [[value(r) for value in getters] for r in rows]
    names = [c.name for c in columns]
    lines: list[str] = []
    if parsable:
        end = delimiter if parsable == "p" else ""
        if header:
            lines.append(delimiter.join(names) + end)
        lines.extend(delimiter.join(v) + end for v in values)
        return lines
    # One format string a line, built once (as columns.render does): each value cut
    # first, then padded, in C.
    widths = [c.width for c in columns]
    line = "".join(
        f"{{:{'<' if c.left else '>'}{c.width}}} " if c.width > 0 else "{} " for c in columns
    ).format
    if header:
        lines.append(line(*[_cut(n, w) for n, w in zip(names, widths, strict=True)]))
        lines.append("".join("-" * w + " " for w in widths))
    for row in values:
        lines.append(line(*[_cut(v, w) for v, w in zip(row, widths, strict=True)]))
    return lines
