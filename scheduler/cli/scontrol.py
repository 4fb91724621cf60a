"""`scontrol`: show jobs, steps, nodes, partitions and the configuration in Slurm's key=value
layout, expand and compress hostlists, hold, release and requeue jobs, suspend and resume
them (operators only), update a pending job's limits, drain and resume nodes (operators
only), and ping the controllers.
Everything but `show hostnames|hostlist` goes through the web API with the user's token."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from scheduler.cli.console import Command, UsageError, parse_command_line
from scheduler.core.contract import JobState
from scheduler.core.contract.job_object import FIELD_NAMES
from scheduler.slurm import scontrol_format as fmt
from scheduler.slurm import step_format
from scheduler.slurm.cmdline import Arg, Option, OptionTable
from scheduler.slurm.hostlist import compress, expand
from scheduler.slurm.jobref import JobRef, parse_job_ref
from scheduler.slurm.timefmt import parse_time_minutes

if TYPE_CHECKING:
    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import CliConfig

PROG = "scontrol"
USAGE = """\
scontrol [<OPTION>] [<COMMAND>]
    Valid <OPTION> values are:
     -d or --details: make show command print more details
     -h or --help: equivalent to "help" command
     -o or --oneliner: equivalent to "oneliner" command
     -Q or --quiet: equivalent to "quiet" command
     -V or --version: equivalent to "version" command

  <keyword> may be omitted from the execute line and scontrol will execute
  in interactive mode. It will process commands as entered until explicitly
  terminated.

    Valid <COMMAND> values are:
     hold <job_list>          prevent specified job from starting.
     ping                     print status of slurmctld daemons.
     release <job_list>       permit specified job to start (see hold).
     requeue <job_id>         re-queue a batch job.
     requeuehold <job_id>     re-queue and hold a batch job.
     resume <jobid_list>      resume previously suspended job (see suspend).
     show <ENTITY> [<ID>]     display state of identified entity, default
                              is all records.
     suspend <job_list>       suspend specified job (see resume).
     update <SPECIFICATIONS>  update job: JobId=<id> followed by TimeLimit=,
                              JobName=, Nice=, Partition= or Comment=;
                              or node (operators): NodeName=<list>
                              State=DRAIN Reason=<why>, or State=RESUME.
     version                  display tool version number.

  <ENTITY> may be "config", "hostnames", "hostlist", "job", "node", "partition",
  "step" or "topology".
"""
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("all", "a", N),
        Option("details", "d", N),
        Option("help", "h", N),
        Option("clusters", "M", R),
        Option("oneliner", "o", N),
        Option("quiet", "Q", N),
        Option("usage", "", N),
        Option("verbose", "v", N),
        Option("version", "V", N),
    ]
)
ENTITIES = ("config", "hostlist", "hostnames", "job", "node", "partition", "step", "topology")
ACTIONS = ("hold", "release", "requeue", "requeuehold", "resume", "suspend")
UNKNOWN_JOB = {"suspend": "Unexpected message received", "resume": "Unexpected message received"}
# `scontrol update` keys a tenant may change on a pending job -> the spec field each sets.
UPDATE_KEYS = {
    "timelimit": "time_limit_min",
    "jobname": "name",
    "name": "name",
    "nice": "nice",
    "partition": "partition",
    "comment": "comment",
}


@dataclass
class ScontrolArgs:
    command: str = ""  # show, ping, version, update, or a job action
    entity: str = ""
    target: str = ""
    job_refs: list[JobRef] = field(default_factory=list)
    update: dict[str, Any] = field(default_factory=dict)
    details: bool = False
    one_liner: bool = False
    quiet: bool = False
    show: str = ""
    warnings: list[str] = field(default_factory=list)
    hosts_text: str = ""  # show hostnames|hostlist: the answer, computed here
    step: str = ""  # show step N.S: the step
    # update NodeName=...: the nodes, and the change ({"state": "drain"|"resume", "reason"})
    node_names: list[str] = field(default_factory=list)
    node_update: dict[str, str] = field(default_factory=dict)


def _entity(word: str) -> str:
    """Slurm takes any unambiguous prefix of an entity (`show part`, `show nodes`)."""
    lowered = word.lower()
    if lowered in ("nodes", "jobs", "partitions"):
        lowered = lowered[:-1]
    matches = [e for e in ENTITIES if e.startswith(lowered)] if lowered else []
    if lowered in ENTITIES:
        return lowered
    if len(matches) == 1 and len(lowered) >= 3:
        return matches[0]
    raise UsageError(f"invalid entity: {word} for keyword: show", 1)


def _hosts(entity: str, operands: list[str], environ: Mapping[str, str]) -> str:
    text = operands[0] if operands else ""
    if not text and entity == "hostnames":
        text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
        if not text:
            raise UsageError("host list is empty", 1)
    if not text:
        raise UsageError("host list is empty", 1)
    try:
        names = expand(text)
    except ValueError:
        raise UsageError(f"Invalid hostlist: {text}", 1) from None
    if entity == "hostnames":
        return "\n".join(names)
    return compress(names)


def _job_refs(words: Sequence[str]) -> list[JobRef]:
    refs = []
    for word in words:
        for item in word.split(","):
            if not item:
                continue
            try:
                refs.append(parse_job_ref(item))
            except ValueError:
                raise UsageError(f"Invalid job id specified: {item}", 1) from None
    return refs


def _update(words: Sequence[str]) -> tuple[list[JobRef], dict[str, Any]]:
    refs: list[JobRef] = []
    changes: dict[str, Any] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise UsageError(f"Invalid input: {word}\nRequest aborted", 1)
        lowered = key.lower()
        if lowered in ("jobid", "job"):
            refs = _job_refs([value])
            continue
        spec_key = UPDATE_KEYS.get(lowered)
        if spec_key is None:
            raise UsageError(
                f"Update of this parameter is not supported: {word}\nRequest aborted", 1
            )
        if spec_key == "time_limit_min":
            try:
                changes[spec_key] = parse_time_minutes(value)
            except ValueError:
                raise UsageError(f"Invalid TimeLimit value: {value}\nRequest aborted", 1) from None
        elif spec_key == "nice":
            try:
                changes[spec_key] = int(value)
            except ValueError:
                raise UsageError(f"Invalid nice value: {value}\nRequest aborted", 1) from None
        else:
            changes[spec_key] = value
    if not refs:
        raise UsageError(
            "No job or node or partition or reservation identification specified\nRequest aborted",
            1,
        )
    if not changes:
        raise UsageError("No changes specified\nRequest aborted", 1)
    return refs, changes


# State= of `scontrol update NodeName=...` -> the change; UNDRAIN is RESUME for a node
# that is not down (ours never are, to an operator's update).
NODE_STATES = {"drain": "drain", "resume": "resume", "undrain": "resume"}


def _node_update(words: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    names: list[str] = []
    change: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        lowered = key.lower()
        if not eq:
            raise UsageError(f"Invalid input: {word}\nRequest aborted", 1)
        if lowered in ("nodename", "node"):
            try:
                names = expand(value)
            except ValueError:
                raise UsageError(f"Invalid node name specified: {value}", 1) from None
        elif lowered == "state":
            state = NODE_STATES.get(value.lower())
            if state is None:
                raise UsageError(
                    f"Invalid input: {word}\nRequest aborted\nValid states are: DRAIN RESUME "
                    "UNDRAIN",
                    1,
                )
            change["state"] = state
        elif lowered == "reason":
            change["reason"] = value
        else:
            raise UsageError(
                f"Update of this parameter is not supported: {word}\nRequest aborted", 1
            )
    if "state" not in change:
        raise UsageError("No changes specified\nRequest aborted", 1)
    if change["state"] == "drain" and not change.get("reason", "").strip():
        raise UsageError(
            "You must specify a reason when DOWNING or DRAINING a node. Request denied", 1
        )
    if change["state"] == "resume":
        change.pop("reason", None)
    return names, change


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> ScontrolArgs:
    parsed = parse_command_line(TABLE, argv, PROG, operands=True, stop_at_operand=True)
    args = ScontrolArgs()
    for option, _value in parsed.options:
        name = option.name
        if name in ("help", "usage"):
            args.show = "help"
        elif name == "version":
            args.show = "version"
        elif name == "details":
            args.details = True
        elif name == "oneliner":
            args.one_liner = True
        elif name == "quiet":
            args.quiet = True
    words = list(parsed.operands)
    # Options may follow the command too (`scontrol show job -d 12`).
    rest = []
    for word in words[1:]:
        if word in ("-d", "--details"):
            args.details = True
        elif word in ("-o", "--oneliner"):
            args.one_liner = True
        else:
            rest.append(word)
    if args.show:
        return args
    if not words:
        raise UsageError("scontrol: error: no command given (interactive mode is not supported)", 1)
    command = words[0].lower()
    args.command = command
    if command in ("version", "-V"):
        args.show = "version"
    elif command == "help":
        args.show = "help"
    elif command == "ping":
        if rest:
            raise UsageError(f"too many arguments for keyword:{words[0]}", 1)
    elif command == "show":
        if not rest:
            raise UsageError("too few arguments for keyword:show", 1)
        args.entity = _entity(rest[0])
        operands = rest[1:]
        if len(operands) > 1:
            raise UsageError(f"too many arguments for keyword:{words[0]}", 1)
        args.target = operands[0] if operands else ""
        if args.entity in ("hostnames", "hostlist"):
            args.hosts_text = _hosts(args.entity, operands, environ)
        elif args.entity == "job" and args.target:
            args.job_refs = _job_refs([args.target])
        elif args.entity == "step" and args.target:
            job_part, _, args.step = args.target.partition(".")
            args.job_refs = _job_refs([job_part])
    elif command in ACTIONS:
        if not rest:
            raise UsageError(f"too few arguments for keyword:{words[0]}", 1)
        args.job_refs = _job_refs(rest)
    elif command == "update":
        if not rest:
            raise UsageError(f"too few arguments for keyword:{words[0]}", 1)
        if any(w.lower().startswith(("nodename=", "node=")) for w in rest):
            args.node_names, args.node_update = _node_update(rest)
        else:
            args.job_refs, args.update = _update(rest)
    else:
        raise UsageError(f"invalid keyword: {words[0]}", 1)
    return args


def offline(args: ScontrolArgs) -> str | None:
    return args.hosts_text or None


def _show(args: ScontrolArgs, client: ApiClient) -> int:
    now = datetime.now(UTC)
    if args.entity == "job":
        # Every field and the spec (tasks, memory, nice, ...), in one answer for them all;
        # the jobs named only (an array's id names its tasks: they are picked here).
        params = {"fields": ",".join(FIELD_NAMES)}
        if args.job_refs:
            params["id"] = ",".join(str(i) for i in sorted({r.job_id for r in args.job_refs}))
        jobs = client.pages("api/v1/queue", params)
        if args.job_refs:
            jobs = [j for j in jobs if any(r.matches(j) for r in args.job_refs)]
            if not jobs:
                print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
                return 1
        if not jobs:
            print("No jobs in the system")
            return 0
        models = fmt.gpu_models(client.pages("api/v1/nodes"))
        detailed = []
        for job in sorted(jobs, key=lambda j: int(j["job_id"])):
            record = fmt.job_record(job, now=now, details=args.details, node_models=models)
            detailed.append(record)
        sys.stdout.write(fmt.render(detailed, one_liner=args.one_liner))
        return 0
    if args.entity == "step":
        return _show_steps(args, client)
    if args.entity == "node":
        nodes = client.pages("api/v1/nodes")
        if args.target:
            wanted = set(expand(args.target))
            nodes = [n for n in nodes if n.get("name") in wanted]
            if not nodes:
                print(f"Node {args.target} not found", file=sys.stderr)
                return 1
        records = [fmt.node_record(n) for n in nodes]
        sys.stdout.write(fmt.render(records, one_liner=args.one_liner))
        return 0
    if args.entity == "partition":
        partitions = client.pages("api/v1/partitions")
        if args.target:
            partitions = [p for p in partitions if p.get("name") == args.target]
            if not partitions:
                print(f"Partition {args.target} not found", file=sys.stderr)
                return 1
        nodes = client.pages("api/v1/nodes")
        records = [fmt.partition_record(p, nodes) for p in partitions]
        sys.stdout.write(fmt.render(records, one_liner=args.one_liner))
        return 0
    if args.entity == "topology":
        for line in fmt.topology_lines(client.pages("api/v1/topology")):
            print(line)
        return 0
    config = client.object("GET", "api/v1/config").get("config") or {}
    for line in fmt.config_lines(config, now=now):
        print(line)
    return 0


def _show_steps(args: ScontrolArgs, client: ApiClient) -> int:
    """`scontrol show step [N[.S]]`, with Slurm's words for what is not there."""
    params = {"fields": ",".join(step_format.FIELDS), "state": JobState.RUNNING.value}
    if args.job_refs:
        params["id"] = str(args.job_refs[0].job_id)
    jobs = [j for j in client.pages("api/v1/queue", params) if _named(args, j)]
    if args.job_refs and args.step and not jobs:
        print("slurm_get_job_steps error: Invalid job id specified", file=sys.stderr)
        return 1
    records = [
        record
        for job in sorted(jobs, key=lambda j: int(j["job_id"]))
        for step, record in step_format.step_records(job)
        if not args.step or step == args.step
    ]
    if not records:
        if not args.job_refs:
            print("No job steps in the system")
            return 0
        print(f"Job step {args.target if args.step else args.target + '.'} not found")
        return 1
    sys.stdout.write(fmt.render(records, one_liner=args.one_liner))
    return 0


def _named(args: ScontrolArgs, job: dict[str, Any]) -> bool:
    return not args.job_refs or any(ref.matches(job) for ref in args.job_refs)


def _ping(client: ApiClient) -> int:
    answer = client.object("GET", "api/v1/ping")
    controllers = answer.get("controllers") or []
    up = False
    for index, ctl in enumerate(controllers):
        role = "primary" if index == 0 else f"backup{index if len(controllers) > 2 else ''}"
        state = "UP" if ctl.get("up") else "DOWN"
        print(f"Slurmctld({role}) at {ctl.get('name', '')} is {state}")
        up = up or bool(ctl.get("up"))
    return 0 if up else 1


def _job_ids(args: ScontrolArgs, client: ApiClient) -> list[int]:
    """The job ids the refs name: an array's id names its tasks too, and a bare id names
    itself even when the queue no longer shows it (the server then says why not)."""
    jobs = client.pages("api/v1/queue")
    ids = {int(j["job_id"]) for j in jobs if any(r.matches(j) for r in args.job_refs)}
    ids |= {ref.job_id for ref in args.job_refs if ref.tasks is None}
    return sorted(ids)


def run(args: ScontrolArgs, config: CliConfig, client: ApiClient) -> int:
    from scheduler.rpc.errors import RpcError

    if args.command == "show":
        return _show(args, client)
    if args.command == "ping":
        return _ping(client)
    if args.node_names:
        return _update_nodes(args, client)
    rc = 0
    for job_id in _job_ids(args, client):
        try:
            if args.command == "update":
                client.object("PATCH", f"api/v1/queue/{job_id}", json=args.update)
            else:
                client.object("POST", f"api/v1/jobs/{job_id}/{args.command}", json={})
        except RpcError as exc:
            rc = 1
            if args.quiet:
                continue
            message = exc.message
            if exc.status == 404:
                # Slurm 22.05's words for an unknown job: suspend and resume get a reply
                # slurm_suspend2 does not expect (seen on a real slurmctld).
                message = UNKNOWN_JOB.get(args.command, "Invalid job id specified")
            # Slurm's words: slurm_perror("slurm_update error"), and "<error> for job N".
            if args.command == "update":
                print(f"slurm_update error: {message}", file=sys.stderr)
            else:
                print(f"{message} for job {job_id}", file=sys.stderr)
    return rc


def _update_nodes(args: ScontrolArgs, client: ApiClient) -> int:
    """update NodeName=... State=DRAIN|RESUME: silent when it worked, as Slurm's."""
    from urllib.parse import quote

    from scheduler.rpc.errors import RpcError

    rc = 0
    for name in args.node_names:
        try:
            client.object("PATCH", f"api/v1/nodes/{quote(name, safe='')}", json=args.node_update)
        except RpcError as exc:
            rc = 1
            if not args.quiet:
                message = "Invalid node name specified" if exc.status == 404 else exc.message
                print(f"slurm_update error: {message}", file=sys.stderr)
    return rc


COMMAND = Command(PROG, USAGE, lambda argv: parse_args(argv, os.environ), run, offline)
main = COMMAND.main
script = COMMAND.script
