"""`squeue`: live jobs from `GET /api/v1/queue`, in Slurm's layouts.

The server filters the queue (states, ids, users, names, accounts, partitions) and cuts
it to the fields the columns read; the answer comes as columns (`shape=columns`), and
squeue only orders, groups and prints it (`squeue_format`), checking on its side only
what the server was not asked (a QoS, an array's tasks, a name holding a comma).
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

from scheduler.cli.clusters import choose
from scheduler.cli.console import Command, UsageError, parse_command_line, print_lines, split_names
from scheduler.core.contract import JobState
from scheduler.slurm import squeue_format
from scheduler.slurm.cmdline import Arg, Option, OptionTable
from scheduler.slurm.jobref import parse_job_ref
from scheduler.slurm.states import ACTIVE, parse_states

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import CliConfig
    from scheduler.slurm.columns import Piece
    from scheduler.slurm.jobref import JobRef

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
_UNSUPPORTED = {"iterate", "sort", "steps", "nodelist"}


class SqueueArgs:
    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces
        self.header = True
        self.job_ids: list[JobRef] = []
        self.expand_arrays = False  # -r: one line per array task
        self.users: set[str] = set()
        self.me = False
        self.names: set[str] = set()
        self.partitions: set[str] = set()
        self.accounts: set[str] = set()
        self.qos: set[str] = set()
        self.states: frozenset[str] | None = ACTIVE
        # --start: when pending jobs are expected to start, in that order.
        self.start = False
        self.clusters: str | None = None  # -M (scheduler/cli/clusters.py)
        self.show = ""
        self.warnings: list[str] = []


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> SqueueArgs:
    parsed = parse_command_line(TABLE, argv, PROG)
    fmt: str | None = None
    long_fmt: str | None = None
    long_list = False
    states_given = False
    args = SqueueArgs([])
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
            long_list = True
        elif name == "start":
            args.start = True
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
            states_given = True
        elif name in _UNSUPPORTED:
            args.warnings.append(f"{PROG}: warning: --{name} is not supported yet; ignored")
    if args.start:
        # As Slurm sets them: its own layout unless -o names one (it wins over -O, -l and
        # the environment), and only pending jobs unless -t names states.
        fmt = fmt or squeue_format.START_FORMAT
        long_fmt = None
        if not states_given:
            args.states = frozenset({JobState.PENDING.value})
    elif long_list and fmt is None:
        fmt = squeue_format.LONG_FORMAT
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


def query(args: SqueueArgs, me: str) -> dict[str, str]:
    """The filters `GET /api/v1/queue` applies, so that only the rows printed travel, and
    the fields the columns read, so that only those travel; `select` applies the others
    (and those the server does not take)."""
    fields = squeue_format.fields_for(args.pieces, by_start=args.start)
    params: dict[str, str] = {"fields": ",".join(fields)}
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


def select(
    cols: Mapping[str, Sequence[Any]],
    count: int,
    args: SqueueArgs,
    me: str,
    applied: Mapping[str, str],
) -> Sequence[int]:
    """The rows of a queue answer (columns of `count` jobs) that squeue shows, the server
    having applied the filters of `applied` (the query it was sent, `query`): the rest
    are applied here. `applied={}` applies them all."""
    users = set(args.users) | ({me} if args.me else set())
    tests: list[tuple[Sequence[Any], Any]] = []
    if args.states is not None and "state" not in applied:
        tests.append((cols["state"], args.states))
    for key, wanted in (
        ("user", users),
        ("name", args.names),
        ("account", args.accounts),
        ("partition", args.partitions),
        ("qos", args.qos),  # the server takes no QoS
    ):
        if wanted and key not in applied:
            tests.append((cols[key], wanted))
    refs = args.job_ids
    if "id" in applied and all(ref.tasks is None for ref in refs):
        refs = []  # the server matched them all
    if not tests and not refs:
        return range(count)
    ids, arrays, tasks = cols["job_id"], cols["array_job_id"], cols["array_task_id"]
    return [
        i
        for i in range(count)
        if all(column[i] in wanted for column, wanted in tests)
        and (not refs or any(ref.names(ids[i], arrays[i], tasks[i]) for ref in refs))
    ]


def shown_rows(
    cols: Mapping[str, Sequence[Any]], rows: Sequence[int], args: SqueueArgs, now: float
) -> tuple[list[int], dict[int, str]]:
    """The rows in squeue's order (`--start`'s: by start time), an array's pending tasks
    grouped unless `-r`."""
    if args.start:
        ordered = squeue_format.order_by_start(cols, rows, now)
    else:
        ordered = squeue_format.order(cols, rows)
    return (ordered, {}) if args.expand_arrays else squeue_format.collapse(cols, ordered)


def select_jobs(
    jobs: Sequence[Mapping[str, Any]], args: SqueueArgs, me: str
) -> list[Mapping[str, Any]]:
    """The job objects (the rows answer) that squeue shows, every filter applied here,
    in its order and grouping (a grouped array's line carries `array_display`)."""
    listed = list(jobs)
    cols = squeue_format.as_columns(listed)
    now = datetime.now(UTC).timestamp()
    rows, shown_ids = shown_rows(cols, select(cols, len(listed), args, me, {}), args, now)
    return [
        {**listed[i], "array_display": shown_ids[i]} if i in shown_ids else listed[i] for i in rows
    ]


def _known(client: ApiClient, ref: JobRef) -> bool:
    """Whether the controller knows the job `ref` names, in any state."""
    count, cols = client.columns("api/v1/queue", {"id": str(ref.job_id), "fields": _IDS})
    ids, arrays, tasks = cols["job_id"], cols["array_job_id"], cols["array_task_id"]
    return any(ref.names(ids[i], arrays[i], tasks[i]) for i in range(count))


def run(args: SqueueArgs, config: CliConfig, client: ApiClient) -> int:
    if args.clusters is not None:
        cluster = choose(PROG, args.clusters, client)
        if cluster is None:
            return 1
        if args.header:  # Slurm heads the queue with its cluster's name, even an error's
            print(f"CLUSTER: {cluster}", flush=True)
    me = config.me if args.me else ""
    params = query(args, me)
    cols: dict[str, list[Any]]
    if params.get("state") == "":
        # Only states Spur never gives: nothing to ask for.
        count, cols = 0, {name: [] for name in params["fields"].split(",")}
    else:
        count, cols = client.columns("api/v1/queue", params)
    if len(args.job_ids) == 1:
        ref, ids = args.job_ids[0], cols["job_id"]
        arrays, tasks = cols["array_job_id"], cols["array_task_id"]
        # A job that the state filter hid is still known (until MinJobAge): Slurm then
        # prints the header alone; only an unknown one is an error.
        if not any(ref.names(ids[i], arrays[i], tasks[i]) for i in range(count)) and not (
            "state" in params and _known(client, ref)
        ):
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
    now = datetime.now(UTC).timestamp()
    rows, shown_ids = shown_rows(cols, select(cols, count, args, me, params), args, now)
    lines = squeue_format.format_columns(
        cols, rows, args.pieces, now=now, header=args.header, shown_ids=shown_ids
    )
    print_lines(lines)
    return 0


COMMAND = Command(PROG, "\n".join(USAGE), lambda argv: parse_args(argv, os.environ), run)
main = COMMAND.main
script = COMMAND.script
