"""`sprio`: the factors of each pending job's priority, as the controller's last pass
ranked it (`GET /api/v1/priorities`; the weights from `/api/v1/config`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.cli.console import Command, UsageError, parse_command_line, split_names
from scheduler.slurm import policy_format
from scheduler.slurm.cmdline import Arg, Option, OptionTable
from scheduler.slurm.columns import Piece

if TYPE_CHECKING:
    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import CliConfig

PROG = "sprio"
USAGE = (
    "Usage: sprio [-j jid[s]] [-u user_name[s]] [-o format] [-p partitions]\n"
    "     [--federation] [--local] [--sibling] [--usage] [-hlnvVw]"
)
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("clusters", "M", R),
        Option("federation", "", N),
        Option("format", "o", R),
        Option("help", "", N),
        Option("jobs", "j", Arg.OPTIONAL),
        Option("local", "", N),
        Option("long", "l", N),
        Option("noheader", "h", N),
        Option("norm", "n", N),
        Option("partition", "p", R),
        Option("sibling", "", N),
        Option("sort", "S", R),
        Option("usage", "", N),
        Option("user", "u", R),
        Option("verbose", "v", N),
        Option("version", "V", N),
        Option("weights", "w", N),
    ]
)
# The factor names the weights of /api/v1/config come under.
WEIGHT_KEYS = {
    "PriorityWeightAge": "age",
    "PriorityWeightFairShare": "fairshare",
    "PriorityWeightJobSize": "size",
    "PriorityWeightPartition": "partition",
    "PriorityWeightQOS": "qos",
}


@dataclass
class SprioArgs:
    pieces: list[Piece]
    header: bool = True
    normalised: bool = False
    weights: bool = False
    jobs: set[int] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    partitions: set[str] = field(default_factory=set)
    show: str = ""
    warnings: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> SprioArgs:
    parsed = parse_command_line(TABLE, argv, PROG)
    args = SprioArgs(pieces=[])
    fmt = environ.get("SPRIO_FORMAT") or policy_format.SPRIO_FORMAT
    for option, value in parsed.options:
        name, text = option.name, value or ""
        if name in ("help", "usage", "version"):
            args.show = name
        elif name == "noheader":
            args.header = False
        elif name == "long":
            fmt = policy_format.SPRIO_LONG_FORMAT
        elif name == "format":
            fmt = text
        elif name == "norm":
            args.normalised = True
        elif name == "weights":
            args.weights = True
        elif name == "jobs":
            for item in split_names(text):
                if not item.isdigit():
                    raise UsageError(f"{PROG}: error: Invalid job id: {item}")
                args.jobs.add(int(item))
        elif name == "user":
            args.users |= split_names(text)
        elif name == "partition":
            args.partitions |= split_names(text)
    try:
        args.pieces = policy_format.parse_sprio_format(fmt)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: {exc}") from exc
    return args


def weights_of(config: Mapping[str, Any]) -> dict[str, int]:
    return {key: int(config.get(name) or 0) for name, key in WEIGHT_KEYS.items()}


def run(args: SprioArgs, config: CliConfig, client: ApiClient) -> int:
    weights = weights_of(client.object("GET", "api/v1/config").get("config") or {})
    if args.weights:
        lines = policy_format.format_sprio([], args.pieces, weights, header=args.header,
                                           show_weights=True)  # fmt: skip
    else:
        rows = [
            r
            for r in client.pages("api/v1/priorities")
            if (not args.jobs or int(r["job_id"]) in args.jobs)
            and (not args.users or r.get("user") in args.users)
            and (not args.partitions or r.get("partition") in args.partitions)
        ]
        if not rows and (args.jobs or args.users):
            print("Unable to find jobs matching user/id(s) specified")  # Slurm's words
            return 0
        lines = policy_format.format_sprio(
            rows, args.pieces, weights, header=args.header, normalised=args.normalised
        )
    for line in lines:
        print(line)
    return 0


COMMAND = Command(PROG, USAGE, lambda argv: parse_args(argv, os.environ), run)
main = COMMAND.main
script = COMMAND.script
