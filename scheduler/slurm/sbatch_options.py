"""sbatch's options: where they come from, and the JobSpec (as JSON) they make (the table
of them, and their `SBATCH_*` variables, is `sbatch_table.py`).

Options come from three places, applied in this order so that later ones win, as in
Slurm: `#SBATCH` lines in the script, `SBATCH_*` environment variables, the command
line. Options Slurm has but Spur cannot honour yet are accepted with a warning, because
a script that worked on a Slurm cluster must not fail here on a `--mail-type` line.
"""

from __future__ import annotations

import os

from scheduler.slurm.batchscript import (
    SbatchError,
    check_script,
    directive_lines,
    error,
    wrap_script,
)
from scheduler.slurm.cmdline import Arg, GetoptError, Option
from scheduler.slurm.memfmt import parse_mem_mb
from scheduler.slurm.sbatch_table import ENVIRONMENT, IGNORED_NAMES, TABLE

# sbatch starts as fast as the interpreter allows (bench/cli.py): what only some options
# need (the core's array, dependency and spec checks, hostlists, dates) is imported where
# they are read, and only the type checker reads these.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime
    from typing import Any

    from scheduler.core.contract import JobSpec
    from scheduler.slurm.cmdline import Parsed

PROG = "sbatch"
SLURM_VERSION = "slurm 22.05.8"
TRY_HELP = 'Try "sbatch --help" for more information'
# Generic resources a Spur node can have. Slurm refuses a name its GresTypes lacks.
KNOWN_GRES = frozenset({"gpu", "shard"})


class SbatchRequest:
    """What `sbatch` was asked to do: a job to submit (`body`, the JobSpec's JSON that
    `POST /api/v1/jobs` takes), or something to print first (`show`)."""

    __slots__ = ("body", "clusters", "parsable", "quiet", "show", "verbose", "wait", "warnings")

    def __init__(
        self,
        body: dict[str, Any] | None,
        *,
        parsable: bool = False,
        wait: bool = False,
        quiet: bool = False,
        verbose: int = 0,
        warnings: list[str] | None = None,
        show: str = "",  # "help", "usage" or "version": print it and exit 0
        clusters: str | None = None,  # -M: checked against the platform's name at submit
    ) -> None:
        self.body, self.parsable, self.wait, self.quiet = body, parsable, wait, quiet
        self.verbose, self.warnings, self.show = verbose, warnings or [], show
        self.clusters = clusters

    @property
    def spec(self) -> JobSpec | None:
        """The body as the contract reads it (what the server will check again)."""
        from scheduler.core.contract import JobSpec

        return None if self.body is None else JobSpec.from_dict(self.body)


class _Values:
    """Last value of each option and the order it was set in, across all sources."""

    def __init__(self) -> None:
        self.values: dict[str, str | None] = {}
        self.order: dict[str, int] = {}
        self.warnings: list[str] = []
        self.verbose = 0
        self.counter = 0

    def set(self, option: Option, value: str | None) -> None:
        name = option.name
        if name in IGNORED_NAMES:
            warning = f"sbatch: warning: --{name} is not supported yet; ignored"
            if warning not in self.warnings:
                self.warnings.append(warning)
            return
        _validate(name, value)
        if name == "verbose":
            self.verbose += 1
        key = "requeue" if name == "no-requeue" else name
        self.values[key] = "0" if name == "no-requeue" else value
        self.counter += 1
        self.order[key] = self.counter

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def has(self, name: str) -> bool:
        return name in self.values

    def latest(self, *names: str) -> str | None:
        """Of options that say the same thing differently, the one set last."""
        present = [n for n in names if n in self.values]
        if not present:
            return None
        return max(present, key=lambda n: self.order[n])


def parse_sbatch(
    argv: Sequence[str],
    *,
    environ: Mapping[str, str],
    cwd: str,
    read_stdin: Callable[[], str],
    read_file: Callable[[str], str] | None = None,
    hostname: str = "",
    now: datetime | None = None,
) -> SbatchRequest:
    """Everything sbatch does before it talks to the server. Raises SbatchError."""
    command_line = _getopt(argv, stop_at_operand=True)
    flags = {option.name for option, _ in command_line.options}
    for show in ("help", "usage", "version"):
        if show in flags:
            return SbatchRequest(None, show=show)

    wrap = next((v for o, v in reversed(command_line.options) if o.name == "wrap"), None)
    operands = command_line.operands
    argv_after: tuple[str, ...] = ()
    if wrap is not None:
        if operands:
            raise error("Script arguments not permitted with --wrap option", 1)
        script, default_name = wrap_script(wrap), "wrap"
    else:
        path = operands[0] if operands else None
        argv_after = tuple(operands[1:])
        if path is None or path in ("-", "/dev/stdin"):
            script, default_name = read_stdin(), "sbatch"
        else:
            script = _read_script(path, read_file)
            default_name = os.path.basename(path)
    check_script(script)

    values = _Values()
    for lineno, words in directive_lines(script):
        try:
            parsed = TABLE.parse(words, stop_at_operand=False)
        except GetoptError as exc:
            raise SbatchError([f"sbatch: {exc}", TRY_HELP], 255) from exc
        if parsed.operands:
            values.warnings.append(
                f"sbatch: warning: ignoring {' '.join(parsed.operands)!r} "
                f"in the #SBATCH line {lineno}"
            )
        for option, value in parsed.options:
            values.set(option, value)
    for variable, name in ENVIRONMENT.items():
        if variable in environ:
            option = TABLE.by_name(name)
            values.set(option, environ[variable] if option.arg is not Arg.NONE else None)
    for option, value in command_line.options:
        values.set(option, value)
    _check_scheduling(values)

    body = _build_body(
        values,
        script=script,
        default_name=default_name,
        argv=argv_after,
        environ=environ,
        cwd=cwd,
        hostname=hostname,
        now=now,
    )
    return SbatchRequest(
        body,
        parsable=values.has("parsable"),
        wait=values.has("wait"),
        quiet=values.has("quiet"),
        verbose=values.verbose,
        warnings=values.warnings,
        clusters=values.get("clusters"),
    )


def _check_scheduling(values: _Values) -> None:
    """`--array` and `--dependency`: the controller checks them too (against its jobs);
    sbatch refuses bad syntax before anything is sent, once every option is read (in
    Slurm the controller refuses them, after sbatch's own checks), in Slurm's words; so
    too a node count of 0."""
    if _min_nodes(values.get("nodes") or "1") < 1:
        raise error("Batch job submission failed: Node count specification invalid", 1)
    if not (values.get("array") or values.get("dependency")):
        return
    from scheduler.core.arrays import parse_array
    from scheduler.core.dependencies import parse_dependency
    from scheduler.core.errors import Rejected
    from scheduler.slurm.refusal import refusal_lines

    for name in ("array", "dependency"):
        value = values.get(name)
        if not value:
            continue
        try:
            parse_array(value) if name == "array" else parse_dependency(value)
        except Rejected as exc:
            lines = refusal_lines(PROG, exc.message, code=exc.code, verbose=bool(values.verbose))
            raise SbatchError(lines, 1) from exc


def _getopt(argv: Sequence[str], *, stop_at_operand: bool) -> Parsed:
    try:
        return TABLE.parse(argv, stop_at_operand=stop_at_operand)
    except GetoptError as exc:
        raise SbatchError([f"sbatch: {exc}", TRY_HELP], 255) from exc


def _read_script(path: str, read_file: Callable[[str], str] | None) -> str:
    try:
        if read_file is not None:
            return read_file(path)
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
            return handle.read()
    except OSError as exc:
        raise error(f"Unable to open file {path}", 1) from exc


_NODES = r"^(\d+)(?:-(\d*))?$"
_GRES = r"^(?:gres[:/])?([A-Za-z_][\w.-]*)(?::([^:,]+))?(?::(\d+))?$"
_GPUS = r"^(?:([^:,]+):)?(\d+)$"


def _match(pattern: str, text: str) -> re.Match[str] | None:
    # `re` where an option that takes a pattern is read, not at start-up: it (and the
    # `enum` it imports) costs a fifth of the interpreter's start, and most submissions
    # give no such option. `re` keeps the compiled patterns.
    import re

    return re.match(pattern, text)


def _validate(name: str, value: str | None) -> None:
    """Refuse a malformed value where Slurm refuses it, with Slurm's words."""
    if value is None:
        return
    if name == "time":
        from scheduler.slurm.timefmt import parse_time_minutes

        try:
            parse_time_minutes(value)
        except ValueError as exc:
            raise error("Invalid --time specification", 255) from exc
    elif name in ("mem", "mem-per-cpu", "mem-per-gpu"):
        try:
            parse_mem_mb(value)
        except ValueError as exc:
            raise error(f"Invalid --{name} specification", 255) from exc
    elif name == "nodes":
        _min_nodes(value)
    elif name in ("ntasks", "cpus-per-task", "ntasks-per-node"):
        _positive_int(name, value)
    elif name == "gres":
        _parse_gres(value)
    elif name in ("gpus", "gpus-per-node"):
        _parse_gpus(name, value)
    elif name in ("nodelist", "exclude"):
        from scheduler.slurm import hostlist

        try:
            hostlist.expand(value)
        except ValueError:
            raise error(f"Invalid --{name} specification: {value}", 255) from None
    elif name == "nice":
        try:
            int(value)
        except ValueError:
            raise error(f"Invalid --nice value: {value}", 255) from None


def _min_nodes(value: str) -> int:
    """`-N 2` or `-N 2-4`: Spur allocates the minimum, which Slurm also tries first."""
    text = value.strip()
    if text.isascii() and text.isdigit():
        return int(text)  # the usual form (and the default "1"): no pattern
    match = _match(_NODES, text)
    if match is None:
        raise error(f"invalid node count `{value}'", 255)
    return int(match.group(1))


def _positive_int(name: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) <= 0:
        raise error(f'Invalid numeric value "{value}" for --{name}.', 1)
    return int(text)


def _parse_gres(value: str) -> tuple[int, str]:
    """`gpu`, `gpu:2`, `gpu:mi300x:2`, `gpu:mi300x` -> (GPUs per node, type)."""
    count, gpu_type, seen = 0, "", False
    for item in value.split(","):
        match = _match(_GRES, item.strip())
        if match is None:
            raise error("Invalid --gres specification", 255)
        gres_name, middle, last = match.groups()
        if gres_name not in KNOWN_GRES:
            raise error("Invalid generic resource (gres) specification", 1)
        if gres_name == "shard":
            continue  # see _parse_shards
        if seen:
            raise error("Invalid --gres specification: gpu given twice", 255)
        seen = True
        if last is not None:
            count, gpu_type = int(last), middle or ""
        elif middle is not None and middle.isdigit():
            count = int(middle)
        else:
            count, gpu_type = 1, middle or ""
    return count, gpu_type.lower()


def _parse_shards(value: str) -> int:
    """`--gres=shard:N` (or `shard:type:N`): N shards of one GPU."""
    for item in value.split(","):
        match = _match(_GRES, item.strip())
        if match is not None and match.group(1) == "shard":
            middle, last = match.group(2), match.group(3)
            if last is not None:
                return int(last)
            return int(middle) if middle is not None and middle.isdigit() else 1
    return 0


def _begin_time(value: str, now: datetime | None) -> float:
    """`--begin`: Slurm's time forms, in the local time zone. A bare time of day that has
    passed means tomorrow, as in Slurm."""
    from datetime import datetime, timedelta

    from scheduler.slurm.timefmt import parse_slurm_datetime

    now = now or datetime.now().astimezone()
    try:
        moment = parse_slurm_datetime(value, now)
    except ValueError:
        raise error(f"Invalid time specification {value}", 255) from None
    if ":" in value and "-" not in value and "/" not in value and moment < now:
        moment += timedelta(days=1)
    return moment.timestamp()


def _parse_gpus(name: str, value: str) -> tuple[int, str]:
    """`--gpus`/`--gpus-per-node`: `N` or `type:N`."""
    match = _match(_GPUS, value.strip())
    if match is None:
        raise error(f"Invalid --{name} specification", 255)
    gpu_type, count = match.groups()
    return int(count), (gpu_type or "").lower()


# The platform's credentials in the submitter's environment. `ALL` does not carry them
# into the job: its code is not to be trusted with the user's API token (a job that must
# submit more names it: `--export=ALL,SPUR_TOKEN`).
NOT_EXPORTED_BY_ALL = frozenset(
    {"SPUR_TOKEN", "SPUR_CLUSTER_TOKEN", "SPUR_STEP_TOKEN", "SPUR_SIGNING_KEY",
     "SPUR_RAFT_PASSWORD"}
)  # fmt: skip


def _export(value: str | None, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """`--export`: ALL (the default), NONE, or `[ALL,]VAR[=value],...`."""
    environ = {k: v for k, v in environ.items() if k not in NOT_EXPORTED_BY_ALL} | {
        k: v for k, v in environ.items() if k in NOT_EXPORTED_BY_ALL and _named(value, k)
    }
    if value is None or value.strip().upper() == "ALL":
        return tuple(sorted(environ.items()))
    if value.strip().upper() == "NONE":
        return ()
    chosen: dict[str, str] = {}
    items = [item.strip() for item in value.split(",") if item.strip()]
    if any(item.upper() == "ALL" for item in items):
        chosen.update(environ)
    for item in items:
        if item.upper() in ("ALL", "NONE"):
            continue
        key, eq, val = item.partition("=")
        if eq:
            chosen[key] = val
        elif key in environ:
            chosen[key] = environ[key]
    return tuple(sorted(chosen.items()))


def _named(value: str | None, key: str) -> bool:
    """Whether `--export` names `key` itself (not only through ALL)."""
    return value is not None and any(
        item.strip().partition("=")[0] == key for item in value.split(",")
    )


def _build_body(
    values: _Values,
    *,
    script: str,
    default_name: str,
    argv: tuple[str, ...],
    environ: Mapping[str, str],
    cwd: str,
    hostname: str,
    now: datetime | None,
) -> dict[str, Any]:
    """The JobSpec's JSON (its wire form, `JobSpec.to_dict`'s keys) that the options
    make. The contract's own checks (bounds, lengths, GPU rules) run where the spec is
    read, on the server, which refuses a bad one with its reason: sbatch prints that as
    Slurm prints a refused submission (`Batch job submission failed: ...`, exit 1), and
    nothing is created. tests/scheduler/slurm/test_sbatch_options.py reads every body
    back through `JobSpec.from_dict`, which refuses a key the contract does not have."""
    get = values.get
    nodes = _min_nodes(get("nodes") or "1")
    cpus_per_task = int(get("cpus-per-task") or 1)
    ntasks_text = get("ntasks")
    if ntasks_text:
        ntasks = int(ntasks_text)
    elif get("ntasks-per-node"):
        ntasks = nodes * int(get("ntasks-per-node") or 1)
    else:
        ntasks = 1

    gpus_per_node, gpus, gpu_type = 0, 0, ""
    per_node = values.latest("gres", "gpus-per-node")
    if per_node == "gres":
        gpus_per_node, gpu_type = _parse_gres(get("gres") or "")
    elif per_node == "gpus-per-node":
        gpus_per_node, gpu_type = _parse_gpus("gpus-per-node", get("gpus-per-node") or "")
    if values.has("gpus"):
        gpus, total_type = _parse_gpus("gpus", get("gpus") or "")
        gpu_type = gpu_type or total_type
    if gpu_type and not (gpus or gpus_per_node):
        gpu_type = ""  # `gpu:type:0` asks for no GPU at all
    shards = _parse_shards(get("gres") or "") if per_node == "gres" else 0

    chdir = get("chdir")
    time_text = get("time")
    mem_key = values.latest("mem", "mem-per-cpu", "mem-per-gpu")
    mem_mb: int | None = None
    if mem_key == "mem":
        mem_mb = parse_mem_mb(get("mem") or "0")
    elif mem_key is not None:
        per_node_of = _per_node_counts(script, nodes, ntasks, cpus_per_task, gpus_per_node, gpus)
        cpus_on_node, gpus_on_node = per_node_of
        if mem_key == "mem-per-cpu":
            # JobSpec asks per node: the node's share is its CPUs times the per-CPU amount.
            mem_mb = parse_mem_mb(get("mem-per-cpu") or "0") * cpus_on_node
        else:
            if not gpus_on_node:
                raise error("--mem-per-gpu needs GPUs (--gres, --gpus or --gpus-per-node)", 255)
            mem_mb = parse_mem_mb(get("mem-per-gpu") or "0") * gpus_on_node
    if time_text:
        from scheduler.slurm.timefmt import parse_time_minutes

        time_limit_min = parse_time_minutes(time_text)
    else:
        time_limit_min = None
    nodelist = get("nodelist") or ""
    exclude = get("exclude") or ""
    if nodelist or exclude:
        from scheduler.slurm import hostlist

        nodelist_names, exclude_names = hostlist.expand(nodelist), hostlist.expand(exclude)
    else:
        nodelist_names, exclude_names = [], []
    return {
        "script": script,
        "name": get("job-name") or default_name,
        "argv": list(argv),
        "workdir": os.path.normpath(os.path.join(cwd, chdir)) if chdir else "",
        "submit_dir": cwd,
        "submit_host": hostname,
        "environment": dict(_export(get("export"), environ)),
        "stdout": get("output") or "",
        "stderr": get("error") or "",
        "stdin": get("input") or "",
        "partition": get("partition") or "",
        "account": get("account") or "",
        "qos": get("qos") or "",
        "time_limit_min": time_limit_min,
        "nodes": nodes,
        "ntasks": ntasks,
        "cpus_per_task": cpus_per_task,
        "mem_per_node_mb": mem_mb,
        "gpus_per_node": gpus_per_node,
        "gpus": gpus,
        "gpu_type": gpu_type,
        "comment": get("comment") or "",
        "requeue": get("requeue") != "0" if values.has("requeue") else None,
        "shards": shards,
        "array": get("array") or "",
        "dependency": get("dependency") or "",
        "hold": values.has("hold"),
        "begin_time": _begin_time(get("begin") or "", now) if get("begin") else None,
        # `--nice` alone is Slurm's default adjustment, 100.
        "nice": int(get("nice") or 100) if values.has("nice") else 0,
        "constraint": get("constraint") or "",
        "nodelist": nodelist_names,
        "exclude": exclude_names,
        "exclusive": values.has("exclusive"),
    }


def _per_node_counts(
    script: str, nodes: int, ntasks: int, cpus_per_task: int, gpus_per_node: int, gpus: int
) -> tuple[int, int]:
    """The CPUs and GPUs the job holds on each node, as the contract derives them
    (`ResourceRequest`): only `--mem-per-cpu` and `--mem-per-gpu` need them."""
    from scheduler.core.contract import JobSpec, ResourceRequest
    from scheduler.core.errors import InvalidSpec

    try:
        request = ResourceRequest.of(
            JobSpec(
                script=script,
                nodes=nodes,
                ntasks=ntasks,
                cpus_per_task=cpus_per_task,
                gpus_per_node=gpus_per_node,
                gpus=gpus,
            )
        )
    except InvalidSpec as exc:
        raise error(str(exc), 1) from exc
    return request.cpus_per_node, request.gpus_per_node


USAGE = """\
Usage: sbatch [-N nnodes] [-n ntasks] [-c ncpus] [-p partition] [-A account]
              [-t minutes] [-J jobname] [-o file] [-e file] [-i file] [-D path]
              [--gres=gpu[:type]:N] [-G [type:]N] [--gpus-per-node=[type:]N]
              [--mem=MB] [--mem-per-cpu=MB] [--parsable] [--wait] [--wrap=cmd]
              [-a array] [-d dependency] [-H] [-b begin] [--nice[=N]] [-q qos]
              [-C constraint] [-w nodelist] [-x nodelist] [--exclusive]
              [--gres=shard:N]
              [executable [args...]]
"""
