"""`sinfo`: partitions and nodes from `GET /api/v1/nodes` and `/api/v1/partitions`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from scheduler.cli.api import ApiClient
from scheduler.cli.clusters import choose
from scheduler.cli.config import CliConfig
from scheduler.cli.console import Command, UsageError, parse_command_line
from scheduler.slurm import sinfo_format
from scheduler.slurm.cmdline import Arg, Option, OptionTable
from scheduler.slurm.columns import Piece
from scheduler.slurm.hostlist import expand

USAGE = (
    "Usage: sinfo [-a] [-h] [-l] [-N] [-n nodes] [-o format] [-O fields] [-p partitions]",
    "             [-t states]",
)
PROG = "sinfo"
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("all", "a", N),
        Option("clusters", "M", R),
        Option("dead", "d", N),
        Option("format", "o", R),
        Option("Format", "O", R),
        Option("help", "", N),
        Option("iterate", "i", R),
        Option("local", "", N),
        Option("long", "l", N),
        Option("Node", "N", N),
        Option("noheader", "h", N),
        Option("nodes", "n", R),
        Option("partition", "p", R),
        Option("responding", "r", N),
        Option("states", "t", R),
        Option("usage", "", N),
        Option("verbose", "v", N),
        Option("version", "V", N),
    ]
)


@dataclass
class SinfoArgs:
    pieces: list[Piece]
    node_oriented: bool = False
    long: bool = False
    header: bool = True
    states: frozenset[str] | None = None
    partitions: frozenset[str] | None = None
    nodes: frozenset[str] | None = None
    clusters: str | None = None  # -M (scheduler/cli/clusters.py)
    show: str = ""
    warnings: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> SinfoArgs:
    parsed = parse_command_line(TABLE, argv, PROG)
    args = SinfoArgs(pieces=[])
    fmt: str | None = None
    long_fmt: str | None = None
    for option, value in parsed.options:
        name, text = option.name, value or ""
        if name in ("help", "usage", "version"):
            args.show = name
        elif name == "Node":
            args.node_oriented = True
        elif name == "long":
            args.long = True
        elif name == "noheader":
            args.header = False
        elif name == "format":
            fmt = text
        elif name == "Format":
            long_fmt = text
        elif name == "partition":
            args.partitions = frozenset(p.strip() for p in text.split(",") if p.strip())
        elif name == "nodes":
            try:
                args.nodes = frozenset(expand(text))
            except ValueError as exc:
                raise UsageError(f"{PROG}: error: {exc}") from exc
        elif name == "states":
            chosen = set()
            for word in text.split(","):
                state = sinfo_format.NODE_STATE_WORDS.get(word.strip().lower())
                if state is None:
                    raise UsageError(f"{PROG}: error: Invalid node state specified: {word}")
                chosen.add(state)
            args.states = frozenset(chosen)
        elif name == "dead":
            args.states = frozenset({"down"})
        elif name == "clusters":
            args.clusters = text
    if fmt is None:
        fmt = environ.get("SINFO_FORMAT")
    if fmt is None:
        if args.node_oriented:
            fmt = sinfo_format.NODE_LONG_FORMAT if args.long else sinfo_format.NODE_FORMAT
        else:
            fmt = sinfo_format.LONG_FORMAT if args.long else sinfo_format.DEFAULT_FORMAT
    try:
        if long_fmt is not None:
            args.pieces = sinfo_format.parse_long_format(long_fmt)
        else:
            args.pieces = sinfo_format.parse_format(fmt)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: {exc}") from exc
    return args


def run(args: SinfoArgs, config: CliConfig, client: ApiClient) -> int:
    if args.clusters is not None:
        cluster = choose(PROG, args.clusters, client)
        if cluster is None:
            return 1
        if args.header:
            print(f"CLUSTER: {cluster}")
    nodes = client.nodes()
    partitions = client.partitions()
    if args.nodes is not None:
        nodes = [n for n in nodes if n.get("name") in args.nodes]
    lines = sinfo_format.format_sinfo(
        nodes,
        partitions,
        args.pieces,
        node_oriented=args.node_oriented,
        header=args.header,
        states=args.states,
        partition_names=args.partitions,
        banner=datetime.now(UTC) if args.long else None,
    )
    for line in lines:
        print(line)
    return 0


COMMAND = Command(PROG, "\n".join(USAGE), lambda argv: parse_args(argv, os.environ), run)
main = COMMAND.main
script = COMMAND.script
