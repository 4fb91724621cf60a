"""Slurm's job description (the v0.0.4x `job_desc_msg` of `POST job/submit`) as our
JobSpec dict: the one place this translation is written.

Each Slurm field is either translated (`TRANSLATED`: its JobSpec field beside it), or
one Slurm knows and we accept without honouring it (`NOT_HONOURED`: a warning names it,
as SLURM.md asks of what we cannot honour yet), or unknown: refused, with the path of the
field (`#/job/<name>`), so a misspelt field never silently changes what runs. Types are
checked here; bounds are the contract's (`JobSpec.from_dict`), and the services check
the rest (workspace paths, caps, credit). Errors name the Slurm field, not ours.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.contract import JobSpec
from scheduler.core.errors import InvalidSpec
from scheduler.slurm import hostlist
from spurcloud.slurmrestd.envelope import (
    ESLURM_REST_FAIL_PARSING,
    ESLURM_REST_INVALID_JOBS_DESC,
    SlurmError,
    warning,
)

# Slurm's field -> the JobSpec field it sets (several Slurm fields may set one of ours).
TRANSLATED: dict[str, str] = {
    "script": "script",
    "name": "name",
    "account": "account",
    "partition": "partition",
    "qos": "qos",
    "comment": "comment",
    "argv": "argv",
    "environment": "environment",
    "current_working_directory": "workdir",
    "standard_output": "stdout",
    "standard_error": "stderr",
    "standard_input": "stdin",
    "time_limit": "time_limit_min",
    "nodes": "nodes",
    "minimum_nodes": "nodes",
    "maximum_nodes": "nodes",
    "tasks": "ntasks",
    "tasks_per_node": "ntasks",
    "cpus_per_task": "cpus_per_task",
    "memory_per_node": "mem_per_node_mb",
    "tres_per_node": "gpus_per_node",
    "tres_per_job": "gpus",
    "constraints": "constraint",
    "required_nodes": "nodelist",
    "excluded_nodes": "exclude",
    "exclusive": "exclusive",
    "shared": "exclusive",
    "array": "array",
    "dependency": "dependency",
    "hold": "hold",
    "begin_time": "begin_time",
    "nice": "nice",
    "requeue": "requeue",
}
# v0.0.38's name for tres_per_node (`"gres": "gpu:1"`), still sent by older clients.
LEGACY = {"gres": "tres_per_node"}
# Fields of Slurm's job description that Spur accepts and does not honour (a warning).
NOT_HONOURED = frozenset(
    [
        "account_gather_frequency",
        "admin_comment",
        "allocation_node_list",
        "allocation_node_port",
        "batch_features",
        "burst_buffer",
        "cluster_constraint",
        "clusters",
        "container",
        "container_id",
        "contiguous",
        "core_specification",
        "cpu_binding",
        "cpu_binding_flags",
        "cpu_frequency",
        "cpus_per_tres",
        "crontab",
        "deadline",
        "delay_boot",
        "distribution",
        "distribution_plane_size",
        "end_time",
        "extra",
        "flags",
        "group_id",
        "hetjob_group",
        "immediate",
        "job_id",
        "kill_on_node_fail",
        "kill_warning_delay",
        "kill_warning_flags",
        "kill_warning_signal",
        "licenses",
        "mail_type",
        "mail_user",
        "maximum_cpus",
        "mcs_label",
        "memory_binding",
        "memory_binding_type",
        "memory_per_cpu",
        "memory_per_tres",
        "minimum_boards_per_node",
        "minimum_cpus",
        "minimum_cpus_per_node",
        "minimum_sockets_per_board",
        "network",
        "ntasks_per_tres",
        "oom_kill_step",
        "open_mode",
        "overcommit",
        "oversubscribe",
        "power_flags",
        "prefer",
        "priority",
        "profile",
        "reboot",
        "required_switches",
        "reservation",
        "reserve_ports",
        "resv_mpi_ports",
        "rlimits",
        "segment_size",
        "selinux_context",
        "site_factor",
        "sockets_per_node",
        "spank_environment",
        "tasks_per_board",
        "tasks_per_core",
        "tasks_per_socket",
        "temporary_disk_per_node",
        "thread_specification",
        "threads_per_core",
        "time_minimum",
        "tres_bind",
        "tres_freq",
        "tres_per_socket",
        "tres_per_task",
        "user_id",
        "wait_all_nodes",
        "wait_for_switch",
        "wckey",
        "x11",
        "x11_magic_cookie",
        "x11_target_host",
        "x11_target_port",
    ]
)
# Our spec field -> the Slurm field an error about it names.
SLURM_NAME: dict[str, str] = {ours: theirs for theirs, ours in reversed(TRANSLATED.items())}
SUBMIT_KEYS = frozenset({"job", "jobs", "script"})

NO_VAL_KEYS = frozenset({"set", "infinite", "number"})
_TRES_RE = re.compile(r"^gres[:/](gpu|shard)(?::([A-Za-z0-9_.-]+))?(?::(\d+))?$")
INFINITE = object()


def _fail(path: str, message: str, number: int = ESLURM_REST_FAIL_PARSING) -> SlurmError:
    return SlurmError(400, number, "Unable to parse the job description", message, path)


@dataclass
class Translation:
    """The JobSpec dict a Slurm job description asks for, and the warnings it earned."""

    spec: dict[str, Any] = field(default_factory=dict)
    warnings: list[dict[str, str]] = field(default_factory=list)

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(warning(message, path))


# -- value readers: each checks the JSON type, and raises SlurmError naming the path ----


def _string(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"{path}: expected a string")
    return value


def _int(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, f"{path}: expected an integer")
    return value


def _bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, f"{path}: expected true or false")
    return value


def _no_val(path: str, value: Any) -> object:
    """A Slurm number: an integer, or `{set, infinite, number}`. Returns the integer,
    None (not set) or INFINITE."""
    if not isinstance(value, dict):
        return _int(path, value)
    unknown = set(value) - NO_VAL_KEYS
    if unknown:
        raise _fail(path, f"{path}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    if value.get("infinite") is not None and _bool(f"{path}/infinite", value["infinite"]):
        return INFINITE
    if "set" in value and not _bool(f"{path}/set", value["set"]):
        return None
    if "number" not in value:
        return None
    return _int(f"{path}/number", value["number"])


def _strings(path: str, value: Any) -> list[str]:
    """A Slurm string list (`string_array`, `csv_string`): a list, or one string."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, f"{path}: expected a list of strings")
    return list(value)


def _hosts(path: str, value: Any) -> list[str]:
    names: list[str] = []
    for item in _strings(path, value):
        for part in item.split(","):
            try:
                names.extend(hostlist.expand(part))
            except ValueError as exc:
                raise _fail(path, f"{path}: {exc}", ESLURM_REST_INVALID_JOBS_DESC) from None
    return names


def _environment(path: str, value: Any) -> dict[str, str]:
    """`["NAME=value", ...]` (v0.0.4x), or `{"NAME": "value"}` (as v0.0.38 took it)."""
    if isinstance(value, dict):
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise _fail(path, f"{path}: expected an object of strings")
        return dict(value)
    env: dict[str, str] = {}
    for i, item in enumerate(_strings(path, value)):
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise _fail(f"{path}[{i}]", f"{path}[{i}]: expected NAME=value, got {item[:80]!r}")
        env[name] = text
    return env


def _tres(path: str, value: Any, t: Translation, *, per_node: bool) -> None:
    """`gres/gpu:2`, `gres/gpu:h100:2`, `gres:gpu:2`, `gres/shard:4` (comma lists)."""
    text = _string(path, value).strip()
    if not text:
        return
    for item in text.split(","):
        if not per_node and item.startswith("gpu:"):
            item = f"gres/{item}"  # tres_per_job also reads `gpu:4`, as --gpus does
        if per_node and not item.startswith("gres"):
            item = f"gres/{item}"  # v0.0.38's `gres: "gpu:1"`
        match = _TRES_RE.match(item.strip())
        if match is None:
            raise _fail(path, f"{path}: invalid TRES {item!r}", ESLURM_REST_INVALID_JOBS_DESC)
        kind, middle, count = match.groups()
        if count is None and middle is not None and middle.isdigit():
            middle, count = None, middle
        number = int(count) if count is not None else 1
        if kind == "shard":
            if not per_node:
                raise _fail(path, f"{path}: shards are asked per node (tres_per_node)")
            t.spec["shards"] = number
            continue
        t.spec["gpus_per_node" if per_node else "gpus"] = number
        if middle:
            t.spec["gpu_type"] = middle.lower()


# -- one reader per translated field ----------------------------------------------------


def _set(ours: str, read: Callable[[str, Any], Any]) -> Callable[[str, Any, Translation], None]:
    def apply(path: str, value: Any, t: Translation) -> None:
        t.spec[ours] = read(path, value)

    return apply


def _time_limit(path: str, value: Any, t: Translation) -> None:
    limit = _no_val(path, value)
    if limit is not None:
        t.spec["time_limit_min"] = 0 if limit is INFINITE else limit


def _memory(path: str, value: Any, t: Translation) -> None:
    mem = _no_val(path, value)
    if mem is not None:
        t.spec["mem_per_node_mb"] = 0 if mem is INFINITE else mem


def _begin(path: str, value: Any, t: Translation) -> None:
    begin = _no_val(path, value)
    if begin is INFINITE:
        raise _fail(path, f"{path}: a begin time cannot be infinite")
    if isinstance(begin, int) and begin:
        t.spec["begin_time"] = float(begin)


def _nodes(path: str, value: Any, t: Translation) -> None:
    """`"2"`, `"2-4"` or `2`: Spur allocates the minimum (Slurm tries it first)."""
    if isinstance(value, int) and not isinstance(value, bool):
        t.spec["nodes"] = value
        return
    match = re.match(r"^\s*(\d{1,9})(?:-(\d{0,9}))?\s*$", _string(path, value))
    if match is None:
        raise _fail(path, f"{path}: expected a node count (N or N-M)")
    t.spec["nodes"] = int(match.group(1))


def _min_nodes(path: str, value: Any, t: Translation) -> None:
    t.spec.setdefault("nodes", _int(path, value))


def _max_nodes(path: str, value: Any, t: Translation) -> None:
    _int(path, value)  # Spur allocates the minimum


def _tasks_per_node(path: str, value: Any, t: Translation) -> None:
    t.spec["_tasks_per_node"] = _int(path, value)


def _exclusive(path: str, value: Any, t: Translation) -> None:
    if isinstance(value, bool):
        t.spec["exclusive"] = value
        return
    flags = _strings(path, value)
    t.spec["exclusive"] = any(f.lower() in ("true", "user", "mcs", "topo") for f in flags)


def _shared(path: str, value: Any, t: Translation) -> None:
    flags = [f.lower() for f in _strings(path, value)]
    if "none" in flags:
        t.spec["exclusive"] = True


READERS: dict[str, Callable[[str, Any, Translation], None]] = {
    "script": _set("script", _string),
    "name": _set("name", _string),
    "account": _set("account", _string),
    "partition": _set("partition", _string),
    "qos": _set("qos", _string),
    "comment": _set("comment", _string),
    "argv": _set("argv", _strings),
    "environment": _set("environment", _environment),
    "current_working_directory": _set("workdir", _string),
    "standard_output": _set("stdout", _string),
    "standard_error": _set("stderr", _string),
    "standard_input": _set("stdin", _string),
    "time_limit": _time_limit,
    "nodes": _nodes,
    "minimum_nodes": _min_nodes,
    "maximum_nodes": _max_nodes,
    "tasks": _set("ntasks", _int),
    "tasks_per_node": _tasks_per_node,
    "cpus_per_task": _set("cpus_per_task", _int),
    "memory_per_node": _memory,
    "tres_per_node": lambda p, v, t: _tres(p, v, t, per_node=True),
    "tres_per_job": lambda p, v, t: _tres(p, v, t, per_node=False),
    "constraints": _set("constraint", _string),
    "required_nodes": _set("nodelist", _hosts),
    "excluded_nodes": _set("exclude", _hosts),
    "exclusive": _exclusive,
    "shared": _shared,
    "array": _set("array", _string),
    "dependency": _set("dependency", _string),
    "hold": _set("hold", _bool),
    "begin_time": _begin,
    "nice": _set("nice", _int),
    "requeue": _set("requeue", _bool),
}
assert set(READERS) == set(TRANSLATED)


def translate_job(job: Any, *, path: str = "#/job") -> Translation:
    """The JobSpec dict (without tenant and user: the token says who) of a Slurm job
    description. Raises SlurmError for an unknown field or a wrong type."""
    if not isinstance(job, dict):
        raise _fail(path, f"{path}: expected an object (the job description)")
    t = Translation()
    unknown = sorted(k for k in job if k not in READERS and k not in NOT_HONOURED | LEGACY.keys())
    if unknown:
        raise _fail(
            f"{path}/{unknown[0]}",
            f"Unknown field(s) in the job description: {', '.join(map(str, unknown))[:500]}",
            ESLURM_REST_INVALID_JOBS_DESC,
        )
    for key in sorted(job, key=lambda k: k != "nodes"):  # -N before minimum_nodes
        value = job[key]
        where = f"{path}/{key}"
        if key in LEGACY:
            if LEGACY[key] in job:
                raise _fail(where, f"give {LEGACY[key]} or {key}, not both")
            t.warn(where, f"{key} is v0.0.38's name: use {LEGACY[key]} (read as it)")
            READERS[LEGACY[key]](where, value, t)
        elif key in NOT_HONOURED:
            t.warn(where, f"{key} is accepted but not honoured by this cluster")
        else:
            READERS[key](where, value, t)
    per_node = t.spec.pop("_tasks_per_node", None)
    if per_node is not None:
        if "ntasks" in t.spec:
            t.warn(f"{path}/tasks_per_node", "tasks_per_node is ignored when tasks is given")
        else:
            t.spec["ntasks"] = per_node * int(t.spec.get("nodes", 1))
    return t


def translate_submit(body: Any) -> Translation:
    """The body of `POST job/submit`: `{"job": {...}}` (or the deprecated top-level
    `script` beside it). A heterogeneous job (`jobs`) is refused."""
    if not isinstance(body, dict):
        raise _fail("#", "The request body must be a JSON object with a job description")
    unknown = sorted(set(body) - SUBMIT_KEYS)
    if unknown:
        raise _fail(
            f"#/{unknown[0]}",
            f"Unknown field(s) in the request: {', '.join(map(str, unknown))[:500]}",
            ESLURM_REST_INVALID_JOBS_DESC,
        )
    if "jobs" in body:
        raise SlurmError(
            400,
            ESLURM_REST_INVALID_JOBS_DESC,
            "Heterogeneous jobs are not supported",
            "Submit one job description as `job`; heterogeneous jobs (`jobs`) are not supported.",
            "#/jobs",
        )
    if "job" not in body:
        raise _fail("#/job", "The request has no job description (`job`)")
    t = translate_job(body["job"])
    if "script" in body:
        script = _string("#/script", body["script"])
        if "script" in t.spec:
            raise _fail("#/script", "give the script once, in job.script")
        t.spec["script"] = script
        t.warn("#/script", "script at the top level is deprecated: put it in job.script")
    if "script" not in t.spec:
        raise SlurmError(
            400,
            ESLURM_REST_INVALID_JOBS_DESC,
            "Batch job script is missing",
            "The job description has no script (job.script).",
            "#/job/script",
        )
    return t


def check_spec(t: Translation) -> JobSpec:
    """The contract's own checks (types and bounds), with the error naming the Slurm
    field; the services check the rest."""
    try:
        return JobSpec.from_dict(t.spec)
    except InvalidSpec as exc:
        raise spec_error(exc.message, exc.field) from exc


def spec_error(message: str, spec_field: str = "") -> SlurmError:
    """A refusal about one of our spec fields, said about the Slurm field that set it."""
    theirs = SLURM_NAME.get(spec_field, spec_field)
    if spec_field in ("gpu_type", "shards", "gpu_milli"):
        theirs = "tres_per_node"
    source = f"#/job/{theirs}" if theirs else "#/job"
    if spec_field and spec_field in message:
        description = message.replace(spec_field, theirs, 1)
    else:
        description = message if not theirs or theirs in message else f"{theirs}: {message}"
    return SlurmError(
        400, ESLURM_REST_INVALID_JOBS_DESC, "Invalid job description", description, source
    )
