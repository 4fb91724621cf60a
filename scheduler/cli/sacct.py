"""`sacct`: job history from `GET /api/v1/jobs`, in Slurm's accounting layout.

The server filters the history (ids, states, a name, users, accounts, partitions, the
time window) and cuts it to the fields the columns read; the answer comes as columns
(`shape=columns`), and sacct only makes and prints its rows (`sacct_format`), checking
on its side only what the server was not asked (several names, a task or a step).
"""

from __future__ import annotations

import time

from scheduler.cli.clusters import choose
from scheduler.cli.console import Command, UsageError, print_lines, split_names
from scheduler.core.contract import JobState
from scheduler.slurm import sacct_format
from scheduler.slurm.cmdline import Arg, GetoptError, Option, OptionTable
from scheduler.slurm.jobref import parse_job_ref
from scheduler.slurm.states import TERMINAL, parse_states
from scheduler.slurm.timefmt import parse_slurm_datetime

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime
    from typing import Any

    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import CliConfig
    from scheduler.slurm.jobref import JobRef
    from scheduler.slurm.sacct_format import Column, Rows

USAGE = (
    "Usage: sacct [-a] [-b] [-j jobs] [-l] [-n] [-o fields] [-p|-P] [-s states]",
    "             [-S start] [-E end] [-u users] [-X] [--name names]",
)
PROG = "sacct"
clock = time.time  # this moment, in epoch seconds (the golden tests stop it)
API_STATES = frozenset(s.value for s in JobState)  # the states the API's filters take
PAGE_SIZE = 50_000  # jobs a page: the API's largest with `fields` (API_MAX_PROJECTED_PAGE_SIZE)
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


class SacctArgs:
    """What the command line asks. Times are epoch seconds: `now`, and the window's ends
    `since` and `until`."""

    def __init__(self, columns: list[Column], now: float | None = None) -> None:
        self.columns = columns
        self.header = True
        self.parsable = ""
        self.delimiter = "|"
        self.allocations_only = False
        self.job_ids: list[int] = []
        # -j as given: a job, an array task (`17_3`) or one step of either (`26.batch`)
        self.refs: list[tuple[JobRef, str | None]] = []
        self.names: set[str] = set()
        self.users: set[str] = set()
        self.accounts: set[str] = set()
        self.partitions: set[str] = set()
        self.states: frozenset[str] | None = None
        self.since: float | None = None
        self.until: float | None = None
        self.clusters: str | None = None  # -M: a filter, as in Slurm's database (clusters.py)
        self.show = ""
        self.warnings: list[str] = []
        self.now = clock() if now is None else now


def parse_args(argv: Sequence[str], now: datetime | None = None) -> SacctArgs:
    """`now`, local and aware, anchors `-S today`, `now-1hours` and the default start;
    None is this moment, read without `datetime` (its import is a tenth of the
    interpreter's start) unless the command line gives a time to read."""
    try:
        parsed = TABLE.parse(argv, stop_at_operand=False)
    except GetoptError as exc:
        raise UsageError(f"{PROG}: {exc}") from exc
    if parsed.operands:
        raise UsageError(f"{PROG}: error: Unknown arguments: {' '.join(parsed.operands)}")
    args = SacctArgs([], None if now is None else now.timestamp())
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
                if now is None:
                    from datetime import datetime

                    now = datetime.fromtimestamp(args.now).astimezone()
                moment = parse_slurm_datetime(text, now).timestamp()
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
        args.since = args.now if args.states is not None else _midnight(args.now, now)
    if args.states is not None and args.until is None and args.since is not None:
        # With -s, the window ends where it starts unless -E says otherwise (sacct(1),
        # -E): the jobs in those states at that moment (golden 63: none).
        args.until = args.since
    try:
        args.columns = sacct_format.parse_fields(fields)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: {exc}") from exc
    return args


def _midnight(moment: float, zoned: datetime | None) -> float:
    """The start of `moment`'s day: in `zoned`'s time zone where given, else locally."""
    if zoned is not None:
        return zoned.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    day = time.localtime(moment)
    return time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0, 0, 0, -1))


def _iso(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


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
        fields = sorted({*fields, "state", "end_time"})  # select: when it came to its state
    params["fields"] = ",".join(fields)
    return params


# The filters the server takes, by the query parameter that carries them.
_SERVER_FILTERS = (("name", "name"), ("user", "user"), ("account", "account"),
                   ("partition", "partition"), ("state", "state"))  # fmt: skip


def select(
    cols: Mapping[str, Sequence[Any]], count: int, args: SacctArgs, applied: Mapping[str, str]
) -> Sequence[int]:
    """The jobs of a history answer (columns of `count` jobs) that sacct shows, the server
    having applied the filters of `applied` (the query it was sent, `query`): the rest
    (several names: the server takes one) are applied here. `applied={}` applies all."""
    wanted = {
        "name": args.names,
        "user": args.users,
        "account": args.accounts,
        "partition": args.partitions,
        "state": set(args.states) if args.states is not None else set(),
    }
    tests = [
        (cols[field_name], wanted[key])
        for key, field_name in _SERVER_FILTERS
        if wanted[key] and key not in applied
    ]
    ids = set(args.job_ids) if "id" not in applied else set()
    until = args.until if args.states is not None and args.until is not None else None
    if not tests and not ids and until is None:
        return range(count)
    job_ids, arrays = cols["job_id"], cols["array_job_id"]
    states, ends = cols.get("state") or [""] * count, cols.get("end_time") or [None] * count
    return [
        i
        for i in range(count)
        # An array job's id names every task of it, as in Slurm.
        if (not ids or job_ids[i] in ids or arrays[i] in ids)
        and all(str(column[i]) in values for column, values in tests)
        and (until is None or _in_state_by(states[i], ends[i], until))
    ]


def _in_state_by(state: str, end: int | None, until: float) -> bool:
    """With -s, a job that ended is in its state from its end on: it counts only if it
    had ended by the window's end (the API's window holds jobs that overlap it)."""
    return state not in TERMINAL or (end is not None and end <= until)


def select_jobs(jobs: Sequence[Mapping[str, Any]], args: SacctArgs) -> list[Mapping[str, Any]]:
    """The job objects (the rows answer) that sacct shows, every filter applied here."""
    from scheduler.slurm.sacct_records import as_columns

    listed = list(jobs)
    return [listed[i] for i in select(as_columns(listed), len(listed), args, {})]


def select_rows(cols: Mapping[str, Sequence[Any]], rows: Rows, args: SacctArgs) -> Rows:
    """The rows -j names: a job's (and its steps'), an array task's, or one step's."""
    if not args.refs:
        return rows
    ids, arrays, tasks = cols["job_id"], cols["array_job_id"], cols["array_task_id"]
    remainders = cols.get("array_tasks") or [None] * len(ids)
    return rows.only(
        i
        for i, (j, step) in enumerate(zip(rows.jobs, rows.steps, strict=True))
        if any(
            ref.names(ids[j], arrays[j], tasks[j], remainders[j])
            and (wanted is None or wanted == step)
            for ref, wanted in args.refs
        )
    )


def run(args: SacctArgs, config: CliConfig, client: ApiClient) -> int:
    params = query(args)
    # -M of other clusters only: Slurm's database has no job of theirs to show.
    cluster = "" if args.clusters is None else choose(PROG, args.clusters, client, quiet=True)
    cols: dict[str, list[Any]]
    if params.get("state") == "" or cluster is None:
        count, cols = 0, {name: [] for name in params["fields"].split(",")}
    else:
        count, cols = client.columns("api/v1/jobs", params)
    chosen = select(cols, count, args, params)
    rows = sacct_format.rows_of(cols, chosen, allocations_only=args.allocations_only)
    lines = sacct_format.format_rows(
        cols,
        select_rows(cols, rows, args),
        args.columns,
        now=args.now,
        header=args.header,
        parsable=args.parsable,
        delimiter=args.delimiter,
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
    parse_args,
    run,
    offline=helpformat,
)
main = COMMAND.main
script = COMMAND.script
