"""`scancel`: cancel or signal jobs through `POST /api/v1/jobs/{id}/cancel`."""

from __future__ import annotations

import sys

from scheduler.cli.api import ApiClient
from scheduler.cli.clusters import choose
from scheduler.cli.config import CliConfig
from scheduler.cli.console import Command, UsageError, error, parse_command_line
from scheduler.rpc.errors import Conflict, NotFound, Refused, Unauthorized
from scheduler.slurm.cmdline import Arg, Option, OptionTable
from scheduler.slurm.jobref import JobRef, parse_job_ref
from scheduler.slurm.states import ACTIVE, parse_states

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from signal import NSIG
    from typing import Any
else:
    from _signal import NSIG  # the C module's: `signal` wraps it in enums (`enum`)

USAGE = (
    "Usage: scancel [-A account] [-n name] [-p partition] [-s signal] [-t state]",
    "               [-u user] [--me] [-v] [job_id[,job_id...]]",
)
PROG = "scancel"
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("account", "A", R),
        Option("batch", "b", N),
        Option("clusters", "M", R),
        Option("full", "f", N),
        Option("help", "", N),
        Option("interactive", "i", N),
        Option("jobname", "", R, key="name"),
        Option("me", "", N),
        Option("name", "n", R),
        Option("nodelist", "w", R),
        Option("partition", "p", R),
        Option("qos", "q", R),
        Option("quiet", "Q", N),
        Option("signal", "s", R),
        Option("state", "t", R),
        Option("usage", "", N),
        Option("user", "u", R),
        Option("verbose", "v", N),
        Option("version", "V", N),
    ]
)


class ScancelArgs:
    """A plain class, not a dataclass: `dataclasses` costs a third of the interpreter's
    start (tests/scheduler/cli/test_startup.py)."""

    def __init__(self) -> None:
        self.job_ids: list[int] = []
        self.task_refs: list[JobRef] = []  # `N_i`, `N_[i-j]`
        self.step_refs: list[tuple[int, int]] = []  # `N.S` (cancel_steps)
        self.signal: int | None = None
        self.verbose = False
        self.quiet = False
        self.filters: dict[str, set[str]] = {}
        self.states: frozenset[str] | None = None
        self.me = False
        self.clusters: str | None = None  # -M (scheduler/cli/clusters.py)
        self.show = ""
        self.warnings: list[str] = []

    @property
    def uses_filters(self) -> bool:
        return bool(self.filters or self.states is not None or self.me)


def parse_signal(text: str) -> int:
    """`USR2`, `SIGUSR2`, `usr2` or `12`."""
    value = text.strip()
    if value.isdigit():
        number = int(value)
        if 0 < number < NSIG:
            return number
    else:
        import signal as signals  # only for a name: it imports `enum`

        name = value.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        try:
            return int(signals.Signals[name])
        except KeyError:
            pass
    raise UsageError(f"{PROG}: error: Invalid job signal: {text}")


def parse_args(argv: Sequence[str]) -> ScancelArgs:
    parsed = parse_command_line(TABLE, argv, PROG, operands=True)
    args = ScancelArgs()
    for option, value in parsed.options:
        name, text = option.name, value or ""
        if name in ("help", "usage", "version"):
            args.show = name
        elif name == "signal":
            args.signal = parse_signal(text)
        elif name == "verbose":
            args.verbose = True
        elif name == "quiet":
            args.quiet = True
        elif name == "me":
            args.me = True
        elif name == "clusters":
            args.clusters = text
        elif name == "state":
            try:
                args.states = parse_states(text)
            except ValueError as exc:
                raise UsageError(f"{PROG}: error: {exc}") from exc
        elif name in ("account", "name", "partition", "qos", "user"):
            items = {i.strip() for i in text.split(",") if i.strip()}
            args.filters.setdefault(name, set()).update(items)
    for word in parsed.operands:
        for item in _split_ids(word):
            if _step_ref(item, args):
                continue
            try:
                ref = parse_job_ref(item)
            except ValueError:
                raise UsageError(f"{PROG}: error: Invalid job id {item}") from None
            if ref.tasks is None:
                args.job_ids.append(ref.job_id)
            else:
                args.task_refs.append(ref)
    return args


def _split_ids(word: str) -> list[str]:
    """`1,17_[2-4,7],9` -> the three ids: commas inside brackets are part of one."""
    items, depth, current = [], 0, ""
    for ch in word:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return [i for i in items if i]


def expand_arrays(jobs: Sequence[Mapping[str, Any]], args: ScancelArgs) -> list[int]:
    """Job ids to cancel: an array job id stands for every task of the array (as Slurm),
    `N_i` and `N_[i-j]` for those tasks; an id the queue lacks is still tried, so the
    controller can say it is invalid."""
    refs = [JobRef(i) for i in args.job_ids] + args.task_refs
    chosen: list[int] = []
    for ref in refs:
        found = [int(j["job_id"]) for j in jobs if ref.matches(j)]
        if not found and ref.tasks is None:
            found = [ref.job_id]
        chosen.extend(i for i in found if i not in chosen)
    return chosen


def matching_jobs(jobs: Sequence[Mapping[str, Any]], args: ScancelArgs, me: str) -> list[int]:
    """Jobs the filters (`-u`, `-p`, `-n`, `-t`, ...) choose among the live ones."""
    filters = dict(args.filters)
    if args.me:
        filters.setdefault("user", set()).add(me)
    states = args.states if args.states is not None else ACTIVE
    chosen = []
    for job in jobs:
        if str(job.get("state")) not in states:
            continue
        refs = [JobRef(i) for i in args.job_ids] + args.task_refs
        if refs and not any(ref.matches(job) for ref in refs):
            continue
        if all(str(job.get(key)) in wanted for key, wanted in filters.items()):
            chosen.append(int(job["job_id"]))
    return sorted(chosen)


def cancel_one(client: ApiClient, job_id: int, args: ScancelArgs) -> None:
    """Slurm is silent about a job that is unknown or over, unless asked to talk."""
    loud = args.verbose or args.signal is not None
    if args.verbose:
        if args.signal is None:
            print(f"{PROG}: Terminating job {job_id}", file=sys.stderr)
        else:
            print(f"{PROG}: Signal {args.signal} to job {job_id}", file=sys.stderr)
    try:
        client.cancel_job(job_id, args.signal)
    except Unauthorized:
        raise
    except NotFound:
        if loud and not args.quiet:
            error(PROG, f"Kill job error on job id {job_id}: Invalid job id specified")
    except (Refused, Conflict) as exc:
        if loud and not args.quiet:
            error(PROG, f"Kill job error on job id {job_id}: {exc.message}")


def parse(argv: list[str]) -> ScancelArgs:
    args = parse_args(argv)
    if (
        not args.show
        and not args.job_ids
        and not args.task_refs
        and not args.step_refs
        and not args.uses_filters
    ):
        raise UsageError(f"{PROG}: error: No job identification provided")
    return args


def run(args: ScancelArgs, config: CliConfig, client: ApiClient) -> int:
    if args.clusters is not None and choose(PROG, args.clusters, client) is None:
        return 1
    if args.uses_filters:
        targets = matching_jobs(client.queue(), args, config.me)
    else:
        targets = expand_arrays(client.queue(), args)
    for job_id in targets:
        cancel_one(client, job_id, args)
    cancel_steps(client, args)
    return 0


# -- job steps: `scancel N.S` (spurcloud/api/steps.py) ------------------------------------


def _step_ref(item: str, args: ScancelArgs) -> bool:
    """`N.S` is a step of job N: noted in `args.step_refs` (True)."""
    job, dot, step = item.strip().partition(".")
    if not dot or not job.isdigit() or not step.isdigit() or len(job) > 18 or len(step) > 9:
        return False
    args.step_refs.append((int(job), int(step)))
    return True


def cancel_steps(client: ApiClient, args: ScancelArgs) -> None:
    """Each `N.S` through `POST /api/v1/jobs/N/steps/S/cancel`; silent about an unknown or
    ended one unless verbose or signalling, as for jobs."""
    loud = args.verbose or args.signal is not None
    for job_id, step_id in args.step_refs:
        shown = f"{job_id}.{step_id}"
        if args.verbose:
            print(f"{PROG}: Terminating step {job_id}.{step_id}", file=sys.stderr)
        body = {} if args.signal is None else {"signal": args.signal}
        try:
            client.object("POST", f"api/v1/jobs/{job_id}/steps/{step_id}/cancel", json=body)
        except Unauthorized:
            raise
        except NotFound:
            if loud and not args.quiet:
                error(PROG, f"Kill job error on job id {shown}: Invalid job id specified")
        except (Refused, Conflict) as exc:
            if loud and not args.quiet:
                error(PROG, f"Kill job error on job id {shown}: {exc.message}")


COMMAND = Command(PROG, "\n".join(USAGE), parse, run)
main = COMMAND.main
script = COMMAND.script
