"""`squeue`: live jobs from `GET /api/v1/queue`, in Slurm's layouts."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from scheduler.cli.api import ApiClient
from scheduler.cli.clusters import choose
from scheduler.cli.config import CliConfig
from scheduler.cli.console import Command, UsageError, parse_command_line, print_lines, split_names
from scheduler.core.contract import JobState
from scheduler.slurm import squeue_format
from scheduler.slurm.cmdline import Arg, Option, OptionTable
from scheduler.slurm.columns import Piece
from scheduler.slurm.jobref import JobRef, collapse_pending, parse_job_ref
from scheduler.slurm.states import ACTIVE, parse_states

API_STATES = frozenset(s.value for s in JobState)  # the states the API's filters take
_IDS = "job_id,array_job_id,array_task_id"  # what -j matches a job by

USAGE = (
    "Usage: squeue [-A account] [-h] [-j jobs] [-l] [--me] [-n name] [-o format]",
    "              [-O fields] [-p partitions] [-q qos] [-t states] [-u users]",
)
PROG = "squeue"
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("account", "A", R),
        Option("all", "a", N),
        Option("array", "r", N),
        Option("clusters", "M", R),
        Option("format", "o", R),
        Option("Format", "O", R),
        Option("help", "", N),
        Option("hide", "", N),
        Option("iterate", "i", R),
        Option("jobs", "j", R),
        Option("local", "", N),
        Option("long", "l", N),
        Option("me", "", N),
        Option("name", "n", R),
        Option("noheader", "h", N),
        Option("nodelist", "w", R),
        Option("partition", "p", R),
        Option("qos", "q", R),
        Option("sort", "S", R),
        Option("start", "", N),
        Option("states", "t", R),
        Option("steps", "s", Arg.OPTIONAL),
        Option("usage", "", N),
        Option("user", "u", R),
        Option("verbose", "v", N),
        Option("version", "V", N),
    ]
)
# Options Slurm has that Spur does not yet honour; the others listed change nothing here.
_UNSUPPORTED = {"iterate", "sort", "start", "steps", "nodelist"}


@dataclass
class SqueueArgs:
    pieces: list[Piece]
    header: bool = True
    job_ids: list[JobRef] = field(default_factory=list)
    expand_arrays: bool = False  # -r: one line per array task
    users: set[str] = field(default_factory=set)
    me: bool = False
    names: set[str] = field(default_factory=set)
    partitions: set[str] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)
    qos: set[str] = field(default_factory=set)
    states: frozenset[str] | None = ACTIVE
    clusters: str | None = None  # -M (scheduler/cli/clusters.py)
    show: str = ""
    warnings: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> SqueueArgs:
    parsed = parse_command_line(TABLE, argv, PROG)
    fmt: str | None = None
    long_fmt: str | None = None
    args = SqueueArgs(pieces=[])
    for option, value in parsed.options:
        name, text = option.name, value or ""
        if name in ("help", "usage", "version"):
            args.show = name
        elif name == "noheader":
            args.header = False
        elif name == "format":
            fmt = text
        elif name == "Format":
            long_fmt = text
        elif name == "long":
            fmt = squeue_format.LONG_FORMAT
        elif name == "jobs":
            for item in split_names(text):
                try:
                    args.job_ids.append(parse_job_ref(item))
                except ValueError:
                    raise UsageError(f"{PROG}: error: Invalid job id: {item}") from None
        elif name == "array":
            args.expand_arrays = True
        elif name == "clusters":
            args.clusters = text
        elif name == "user":
            args.users |= split_names(text)
        elif name == "me":
            args.me = True
        elif name == "name":
            args.names |= split_names(text)
        elif name == "partition":
            args.partitions |= split_names(text)
        elif name == "account":
            args.accounts |= split_names(text)
        elif name == "qos":
            args.qos |= split_names(text)
        elif name == "states":
            try:
                args.states = parse_states(text)
            except ValueError as exc:
                raise UsageError(f"{PROG}: error: {exc}") from exc
        elif name in _UNSUPPORTED:
            args.warnings.append(f"{PROG}: warning: --{name} is not supported yet; ignored")
    try:
        if long_fmt is not None:
            args.pieces = squeue_format.parse_long_format(long_fmt)
        elif fmt is not None:
            args.pieces = squeue_format.parse_format(fmt)
        elif environ.get("SQUEUE_FORMAT2"):
            args.pieces = squeue_format.parse_long_format(environ["SQUEUE_FORMAT2"])
        else:
            chosen = environ.get("SQUEUE_FORMAT") or squeue_format.DEFAULT_FORMAT
            args.pieces = squeue_format.parse_format(chosen)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: {exc}") from exc
    return args


def select_jobs(
    jobs: Sequence[Mapping[str, Any]], args: SqueueArgs, me: str
) -> list[Mapping[str, Any]]:
    users = set(args.users) | ({me} if args.me else set())

    def keep(job: Mapping[str, Any]) -> bool:
        if args.states is not None and str(job.get("state")) not in args.states:
            return False
        if args.job_ids and not any(ref.matches(job) for ref in args.job_ids):
            return False
        checks = (
            (users, job.get("user")),
            (args.names, job.get("name")),
            (args.partitions, job.get("partition")),
            (args.accounts, job.get("account")),
            (args.qos, job.get("qos")),
        )
        return all(not wanted or value in wanted for wanted, value in checks)

    chosen = squeue_format.sort_jobs(j for j in jobs if keep(j))
    return chosen if args.expand_arrays else collapse_pending(chosen)


def query(args: SqueueArgs, me: str) -> dict[str, str]:
    """The filters `GET /api/v1/queue` applies, so that only the rows printed travel, and
    the fields the columns read, so that only those travel; `select_jobs` applies the
    filters all again (and those the server does not take)."""
    params: dict[str, str] = {"fields": ",".join(squeue_format.fields_for(args.pieces))}
    if args.job_ids:
        # The server matches a job id or an array's, as -j does; tasks are picked here.
        params["id"] = ",".join(str(i) for i in sorted({ref.job_id for ref in args.job_ids}))
    if args.states is not None:
        known = sorted(args.states & API_STATES)  # Slurm's others never occur in Spur
        params["state"] = ",".join(known) if known else ""
    users = set(args.users) | ({me} if args.me else set())
    for key, values in (
        ("user", users),
        ("name", args.names),
        ("account", args.accounts),
        ("partition", args.partitions),
    ):
        if values and all(v and "," not in v for v in values):
            params[key] = ",".join(sorted(values))
    return params


def run(args: SqueueArgs, config: CliConfig, client: ApiClient) -> int:
    if args.clusters is not None:
        cluster = choose(PROG, args.clusters, client)
        if cluster is None:
            return 1
        if args.header:  # Slurm heads the queue with its cluster's name, even an error's
            print(f"CLUSTER: {cluster}", flush=True)
    params = query(args, config.me if args.me else "")
    if params.get("state") == "":
        jobs: list[dict[str, Any]] = []  # only states Spur never gives: nothing to ask for
    else:
        jobs = client.queue(params)
    if len(args.job_ids) == 1 and not any(args.job_ids[0].matches(j) for j in jobs):
        # A job that the state filter hid is still known (until MinJobAge): Slurm then
        # prints the header alone; only an unknown one is an error.
        wanted = args.job_ids[0]
        known = "state" in params and any(
            wanted.matches(j) for j in client.queue({"id": str(wanted.job_id), "fields": _IDS})
        )
        if not known:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
    shown = select_jobs(jobs, args, config.me)
    lines = squeue_format.format_jobs(shown, args.pieces, now=datetime.now(UTC), header=args.header)
    print_lines(lines)
    return 0


COMMAND = Command(PROG, "\n".join(USAGE), lambda argv: parse_args(argv, os.environ), run)
main = COMMAND.main
