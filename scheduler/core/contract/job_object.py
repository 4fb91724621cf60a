"""The job object: what every API answers about a job (`Job.to_dict()` in the core; the
web API's job with its times as ISO 8601 strings).

`history=False` marks what only the live queue knows (the controller's view now); the
history (`JobRecord`, what sacct reads) keeps the rest. The web API's response
serializers, and so its OpenAPI schema, are built from this table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.contract.fields import Kind
from scheduler.core.errors import InvalidSpec


@dataclass(frozen=True)
class JobField:
    name: str
    kind: Kind
    help: str
    nullable: bool = False
    history: bool = True  # the history keeps it (else: live queue only)
    always: bool = True  # in every answer (else: only where its help says)


_S, _I, _T, _B = Kind.STRING, Kind.INTEGER, Kind.TIME, Kind.BOOLEAN

JOB_FIELDS: tuple[JobField, ...] = (
    JobField("job_id", _I, "The job id (an array task has its own)."),
    JobField("name", _S, "The job's name."),
    JobField("tenant", _S, "The organisation."),
    JobField("user", _S, "The submitter's user name."),
    JobField("account", _S, "The account charged."),
    JobField("partition", _S, "The partition."),
    JobField("qos", _S, "The QoS."),
    JobField("state", _S, "The job's state (see the enum)."),
    JobField("reason", _S, 'Slurm\'s reason: why it waits, or why it failed ("None").'),
    JobField("submit_time", _T, "When it was submitted.", nullable=True),
    JobField("eligible_time", _T, "Since when it may start.", nullable=True),
    JobField("start_time", _T, "When it started (this attempt).", nullable=True),
    JobField("end_time", _T, "When it ended.", nullable=True),
    JobField(
        "suspended_at",
        _T,
        "Since when it is suspended (scontrol suspend); null: it is not.",
        nullable=True,
        history=False,
    ),
    JobField(
        "suspended_s",
        Kind.NUMBER,
        "Seconds this attempt spent suspended before (its time limit counts the rest).",
        history=False,
    ),
    JobField("time_limit_min", _I, "Its time limit in minutes; null: unlimited.", nullable=True),
    JobField("nodes", Kind.STRINGS, "Its nodes, in allocation order (the first runs the script)."),
    JobField("num_nodes", _I, "Nodes, asked for or held."),
    JobField("num_cpus", _I, "CPUs in all, asked for or held."),
    JobField("num_gpus", _I, "GPU devices in all, asked for or held (a share counts one)."),
    JobField("gpu_milli", _I, "GPU capacity in all, in thousandths of a GPU."),
    JobField("gpu_type", _S, 'The GPU model asked for ("" any).'),
    JobField(
        "allocation",
        Kind.OBJECT,
        "What it holds on each node: {node: {gpus: [index], cpus, mem_mb, gpu_milli?, cpu_ids?}}.",
    ),
    JobField("exit_code", _I, "The script's exit status.", nullable=True),
    JobField("signal", _I, "The signal that ended it (0: none).", nullable=True),
    JobField("attempt", _I, "How many times it was started (requeues count)."),
    JobField(
        "limits",
        _S,
        'How its memory and process limits were enforced: "cgroup2", "rlimit" ("": not started).',
    ),
    JobField("array_job_id", _I, "For an array task: the array's job id.", nullable=True),
    JobField(
        "array_task_id",
        _I,
        "For an array task: its index (null for an array's pending remainder).",
        nullable=True,
    ),
    JobField(
        "array_tasks",
        _S,
        "For an array's pending remainder (one record, as Slurm keeps it): the task ids it "
        'stands for ("5-9,12"); "" for any other job. The live queue lists each task.',
    ),
    JobField("workdir", _S, "Its working directory as asked (--chdir, or the submit directory)."),
    JobField("stdout", _S, "The output pattern (%j is the job id)."),
    JobField("stderr", _S, 'The error pattern; "" means the same as stdout.'),
    JobField("comment", _S, "Its comment."),
    JobField("interactive", _B, "An allocation of salloc or srun: it has no batch step."),
    JobField(
        "steps",
        Kind.OBJECT,
        "Its job steps (srun), oldest first: [{step_id, name, nodes, ntasks, cpus, state, "
        "start_time, end_time, exit_code, signal}] (scheduler/core/contract/steps.py).",
    ),
    JobField("seq", _I, "Sequence number of its last change: a newer answer has a higher one."),
    JobField(
        "priority",
        _I,
        "Its priority (for a pending job, as the last pass ranked it).",
        history=False,
    ),
    JobField(
        "array_throttle",
        _I,
        "For an array task: at most this many run at once (0: no cap).",
        history=False,
    ),
    JobField(
        "dependency", _S, 'What it still waits for (squeue %E; "(null)": nothing).', history=False
    ),
    JobField("held", _B, "Whether it is held.", history=False),
    JobField(
        "pid", _I, "The batch script's process id on its first node.", nullable=True, history=False
    ),
    JobField(
        "started_at",
        _T,
        "When the agent reported the script started.",
        nullable=True,
        history=False,
    ),
    JobField("cancelled_by", _S, "Who cancelled it.", history=False),
    JobField(
        "expected_start",
        _T,
        "For a pending job: when the scheduler expects it to start, as the leader's last "
        "estimate reserved resources for it, or its begin time while it waits for that "
        "(squeue --start, Slurm's StartTime); null: unknown (N/A). An estimate of the "
        "leader's plan, not a fact of the log.",
        nullable=True,
        history=False,
    ),
    JobField(
        "sched_nodes",
        Kind.STRINGS,
        "For a pending job: the nodes that estimate reserved for it, in name order "
        "(Slurm's SchedNodes); empty: none.",
        history=False,
    ),
    JobField(
        "priority_factors",
        Kind.OBJECT,
        "For a pending job: the factors of its priority (age, fairshare, qos, partition, "
        "size, nice, priority), as the last pass ranked it. Only on pending jobs.",
        history=False,
        always=False,
    ),
    JobField(
        "spec",
        Kind.OBJECT,
        "The JobSpec as submitted. Only on single-job answers, and lists that ask for it.",
        nullable=True,
        always=False,
    ),
)

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in JOB_FIELDS)


def select_fields(names: Iterable[str], *, allowed: Iterable[str] = FIELD_NAMES) -> tuple[str, ...]:
    """The fields a list answer is cut to (`?fields=job_id,state`: what a command prints,
    and nothing else travels), in the contract's order, the job id always among them.
    InvalidSpec (field `fields`) names any that `allowed` does not hold."""
    wanted = set(names)
    unknown = wanted.difference(allowed)
    if unknown:
        named = ", ".join(sorted(unknown)[:5]) + (", ..." if len(unknown) > 5 else "")
        raise InvalidSpec(f"unknown job field(s): {named}", field="fields")
    wanted.add("job_id")
    return tuple(name for name in FIELD_NAMES if name in wanted)


# The list answers' other shape (`?shape=columns`, what squeue and sacct read): each field
# a column, `columns[field][i]` job i's value, in the list's order, and times as whole
# epoch seconds rather than ISO text. A list of 10,000 jobs is then one short list per
# field (a few hundred kB, decoded in milliseconds), not 10,000 objects repeating every
# key; the commands format a column at a time, most of its values alike. The third,
# `?shape=runs`, is the columns answer with each column of long runs of one value sent
# as its runs (`runs.py`): what the commands ask for.
SHAPES = ("rows", "columns", "runs")
COLUMN_SHAPES = frozenset(SHAPES[1:])
TIME_FIELDS = frozenset(f.name for f in JOB_FIELDS if f.kind is Kind.TIME)


def to_columns(jobs: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> dict[str, Any]:
    """Job dicts (times in epoch seconds, as the core gives them) as a columns answer,
    None where a job lacks the field (`always=False` ones)."""
    return columns_answer(len(jobs), {name: [job.get(name) for job in jobs] for name in fields})


def columns_answer(count: int, columns: dict[str, list[Any]]) -> dict[str, Any]:
    """`{"n": count, "columns": {field: [...]}}` of `count` jobs' values per field (times
    in epoch seconds), its times cut to the second, as the rows' ISO 8601 text is."""
    for name, values in columns.items():
        if name in TIME_FIELDS:
            columns[name] = [None if v is None else int(v // 1) for v in values]
    return {"n": count, "columns": columns}


__all__ = [
    "FIELD_NAMES",
    "JOB_FIELDS",
    "COLUMN_SHAPES",
    "SHAPES",
    "TIME_FIELDS",
    "JobField",
    "columns_answer",
    "select_fields",
    "to_columns",
]
