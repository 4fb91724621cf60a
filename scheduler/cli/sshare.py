"""`sshare`: fair share per account and its users (`GET /api/v1/shares`). The
organisation is the account, its members the users; a tenant sees its own account."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.cli.console import Command, UsageError, parse_command_line, split_names
from scheduler.slurm import policy_format
from scheduler.slurm.cmdline import Arg, Option, OptionTable

if TYPE_CHECKING:
    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import CliConfig

PROG = "sshare"
USAGE = (
    "Usage:  sshare [-A accounts] [-a] [-l] [-n] [-o format] [-p] [-P] [-u users] [-U]\n"
    "               [-v] [-V]"
)
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("accounts", "A", R),
        Option("all", "a", N),
        Option("clusters", "M", R),
        Option("format", "o", R),
        Option("help", "", N),
        Option("long", "l", N),
        Option("noheader", "n", N),
        Option("parsable", "p", N),
        Option("parsable2", "P", N),
        Option("usage", "", N),
        Option("users", "u", R),
        Option("Users", "U", N),
        Option("verbose", "v", N),
        Option("version", "V", N),
    ]
)


@dataclass
class SshareArgs:
    names: list[str]
    header: bool = True
    delimiter: str | None = None
    trailing: bool = False
    all_users: bool = False
    users_only: bool = False
    accounts: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    show: str = ""
    warnings: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> SshareArgs:
    parsed = parse_command_line(TABLE, argv, PROG)
    args = SshareArgs(names=[])
    fmt = policy_format.SSHARE_FORMAT
    for option, value in parsed.options:
        name, text = option.name, value or ""
        if name in ("help", "usage", "version"):
            args.show = name
        elif name == "noheader":
            args.header = False
        elif name == "parsable":
            args.delimiter, args.trailing = "|", True
        elif name == "parsable2":
            args.delimiter, args.trailing = "|", False
        elif name == "long":
            fmt = policy_format.SSHARE_LONG_FORMAT
        elif name == "format":
            fmt = text
        elif name == "all":
            args.all_users = True
        elif name == "Users":
            args.users_only = True
        elif name == "accounts":
            args.accounts |= split_names(text)
        elif name == "users":
            args.users |= split_names(text)
    try:
        args.names = policy_format.parse_sshare_format(fmt)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: {exc}") from exc
    return args


def run(args: SshareArgs, config: CliConfig, client: ApiClient) -> int:
    me = config.me
    users = args.users or ({me} if not args.all_users else set())
    rows = []
    for row in client.pages("api/v1/shares"):
        if args.accounts and row.get("account") not in args.accounts:
            continue
        user = row.get("user") or ""
        if not user and args.users_only:
            continue
        if user and users and user not in users:
            continue
        rows.append(row)
    lines = policy_format.format_sshare(
        rows, args.names, header=args.header, delimiter=args.delimiter, trailing=args.trailing
    )
    for line in lines:
        print(line)
    return 0


COMMAND = Command(PROG, USAGE, lambda argv: parse_args(argv, os.environ), run)
main = COMMAND.main
script = COMMAND.script
