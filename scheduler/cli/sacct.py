"""`sacct`: job history from `GET /api/v1/jobs`, in Slurm's accounting layout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from scheduler.cli.api import ApiClient
from scheduler.cli.clusters import choose
from scheduler.cli.config import CliConfig
from scheduler.cli.console import Command, UsageError, print_lines, split_names
from scheduler.core.contract import JobState
from scheduler.slurm import sacct_format
from scheduler.slurm.cmdline import Arg, GetoptError, Option, OptionTable
from scheduler.slurm.jobref import JobRef, parse_job_ref
from scheduler.slurm.sacct_format import Column, Record
from scheduler.slurm.states import TERMINAL, parse_states
from scheduler.slurm.timefmt import parse_iso, parse_slurm_datetime

USAGE = (
    "Usage: sacct [-a] [-b] [-j jobs] [-l] [-n] [-o fields] [-p|-P] [-s states]",
    "             [-S start] [-E end] [-u users] [-X] [--name names]",
)
PROG = "sacct"
API_STATES = frozenset(s.value for s in JobState)  # the states the API's filters take
PAGE_SIZE = 10_000  # jobs a page: the API's largest with `fields` (API_MAX_PROJECTED_PAGE_SIZE)
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("accounts", "A", R),
        Option("allclusters", "L", N),
        Option("allocations", "X", N),
        Option("allusers", "a", N),
        Option("brief", "b", N),
        Option("clusters", "M", R),
        Option("delimiter", "", R),
        Option("duplicates", "D", N),
        Option("endtime", "E", R),
        Option("format", "o", R),
        Option("help", "h", N),
        Option("helpformat", "e", N),
        Option("jobs", "j", R),
        Option("long", "l", N),
        Option("name", "", R),
        Option("noheader", "n", N),
        Option("parsable", "p", N),
        Option("parsable2", "P", N),
        Option("partition", "r", R),
        Option("qos", "q", R),
        Option("starttime", "S", R),
        Option("state", "s", R),
        Option("units", "", R),
        Option("usage", "", N),
        Option("user", "u", R),
        Option("verbose", "v", N),
        Option("version", "V", N),
    ]
)


@dataclass
class SacctArgs:
    columns: list[Column]
    header: bool = True
    parsable: str = ""
    delimiter: str = "|"
    allocations_only: bool = False
    job_ids: list[int] = field(default_factory=list)
    # -j as given: a job, an array task (`17_3`) or one step of either (`26.batch`, `26.0`)
    refs: list[tuple[JobRef, str | None]] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)
    partitions: set[str] = field(default_factory=set)
    states: frozenset[str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    clusters: str | None = None  # -M: a filter, as in Slurm's database (clusters.py)
    show: str = ""
    warnings: list[str] = field(default_factory=list)
    now: datetime = field(default_factory=lambda: datetime.now().astimezone())


def parse_args(argv: Sequence[str], now: datetime) -> SacctArgs:
    """`now` is local and aware: it anchors `-S today`, `now-1hours` and the default start."""
    try:
        parsed = TABLE.parse(argv, stop_at_operand=False)
    except GetoptError as exc:
        raise UsageError(f"{PROG}: {exc}") from exc
    if parsed.operands:
        raise UsageError(f"{PROG}: error: Unknown arguments: {' '.join(parsed.operands)}")
    args = SacctArgs(columns=[], now=now)
    fields = sacct_format.DEFAULT_FIELDS
    started = False
    for option, value in parsed.options:
        name, text = option.name, value or ""
        if name in ("help", "usage", "version", "helpformat"):
            args.show = name
        elif name == "allocations":
            args.allocations_only = True
        elif name == "noheader":
            args.header = False
        elif name == "parsable":
            args.parsable = "p"
        elif name == "parsable2":
            args.parsable = "P"
        elif name == "delimiter":
            args.delimiter = text
        elif name == "format":
            fields = text
        elif name == "brief":
            fields = sacct_format.BRIEF_FIELDS
        elif name == "long":
            fields = sacct_format.LONG_FIELDS
        elif name == "jobs":
            for item in (p.strip() for p in text.split(",") if p.strip()):  # in given order
                job_part, dot, step = item.partition(".")
                try:
                    ref = parse_job_ref(job_part)
                except ValueError:
                    raise UsageError(f"{PROG}: error: Invalid job id: {item}") from None
                if dot and not (step.isdigit() or step in ("batch", "extern")):
                    raise UsageError(f"{PROG}: error: Invalid job id: {item}")
                args.refs.append((ref, step if dot else None))
                args.job_ids.append(ref.job_id)
        elif name == "name":
            args.names |= split_names(text)
        elif name == "user":
            args.users |= split_names(text)
        elif name == "accounts":
            args.accounts |= split_names(text)
        elif name == "partition":
            args.partitions |= split_names(text)
        elif name == "state":
            try:
                args.states = parse_states(text)
            except ValueError as exc:
                raise UsageError(f"{PROG}: error: {exc}") from exc
        elif name in ("starttime", "endtime"):
            try:
                moment = parse_slurm_datetime(text, now)
            except ValueError as exc:
                raise UsageError(f"{PROG}: error: Invalid time specification: {text}") from exc
            if name == "starttime":
                args.since, started = moment, True
            else:
                args.until = moment
        elif name == "clusters":
            args.clusters = text
        elif name == "units":
            args.warnings.append(f"{PROG}: warning: --units is not supported yet; ignored")
    if not started and not args.job_ids:
        # Like Slurm: without -j or -S, the history starts at midnight today, or now
        # with -s (sacct(1), -S).
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        args.since = now if args.states is not None else midnight
    if args.states is not None and args.until is None and args.since is not None:
        # With -s, the window ends where it starts unless -E says otherwise (sacct(1),
        # -E): the jobs in those states at that moment (golden 63: none).
        args.until = args.since
    try:
        args.columns = sacct_format.parse_fields(fields)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: {exc}") from exc
    return args


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def query(args: SacctArgs) -> dict[str, str]:
    """The filters `GET /api/v1/jobs` takes."""
    params: dict[str, str] = {}
    if args.job_ids:
        params["id"] = ",".join(str(i) for i in sorted(set(args.job_ids)))
    if args.states is not None:
        # Slurm's states that Spur never gives are not the API's: none of them, no job.
        params["state"] = ",".join(sorted(args.states & API_STATES))
    if len(args.names) == 1:
        params["name"] = next(iter(args.names))
    for key, values in (
        ("user", args.users),
        ("account", args.accounts),
        ("partition", args.partitions),
    ):
        if values:
            params[key] = ",".join(sorted(values))
    if args.since is not None:
        params["since"] = _iso(args.since)
    if args.until is not None:
        params["until"] = _iso(args.until)
    params["limit"] = str(PAGE_SIZE)
    fields = sacct_format.fields_for(args.columns, allocations_only=args.allocations_only)
    if args.states is not None:
        fields = sorted({*fields, "end_time"})  # select_jobs: when it came to its state
    params["fields"] = ",".join(fields)
    return params


def select_jobs(jobs: Sequence[Mapping[str, Any]], args: SacctArgs) -> list[Mapping[str, Any]]:
    """The filters again on our side, for those the server takes one value of only."""
    ids = {str(i) for i in args.job_ids}
    checks = (
        ("name", args.names),
        ("user", args.users),
        ("account", args.accounts),
        ("partition", args.partitions),
        ("state", set(args.states) if args.states is not None else set()),
    )
    return [
        job
        for job in jobs
        # An array job's id names every task of it, as in Slurm.
        if (not ids or str(job.get("job_id")) in ids or str(job.get("array_job_id")) in ids)
        and all(not wanted or str(job.get(key)) in wanted for key, wanted in checks)
        and _in_state_by(job, args)
    ]


def _in_state_by(job: Mapping[str, Any], args: SacctArgs) -> bool:
    """With -s, a job that ended is in its state from its end on: it counts only if it
    had ended by the window's end (the API's window holds jobs that overlap it)."""
    if args.states is None or args.until is None or str(job.get("state")) not in TERMINAL:
        return True
    end = parse_iso(job.get("end_time"))
    return end is not None and end <= args.until


def select_rows(rows: list[Record], args: SacctArgs) -> list[Record]:
    """The rows -j names: a job's (and its steps'), an array task's, or one step's."""
    if not args.refs:
        return rows
    return [
        row
        for row in rows
        if any(
            ref.matches(row.job) and (step is None or step == row.step) for ref, step in args.refs
        )
    ]


def run(args: SacctArgs, config: CliConfig, client: ApiClient) -> int:
    params = query(args)
    # -M of other clusters only: Slurm's database has no job of theirs to show.
    cluster = "" if args.clusters is None else choose(PROG, args.clusters, client, quiet=True)
    jobs = [] if params.get("state") == "" or cluster is None else client.list_jobs(params)
    rows = sacct_format.records(
        select_jobs(jobs, args), now=args.now, allocations_only=args.allocations_only
    )
    rows = select_rows(rows, args)
    lines = sacct_format.format_sacct(
        rows, args.columns, header=args.header, parsable=args.parsable, delimiter=args.delimiter
    )
    print_lines(lines)
    return 0


def helpformat(args: SacctArgs) -> str | None:
    if args.show != "helpformat":
        return None
    names = list(sacct_format.FIELDS)
    return "\n".join(
        "".join(n.ljust(20) for n in names[start : start + 4]).rstrip()
        for start in range(0, len(names), 4)
    )


COMMAND = Command(
    PROG,
    "\n".join(USAGE),
    lambda argv: parse_args(argv, datetime.now().astimezone()),
    run,
    offline=helpformat,
)
main = COMMAND.main
