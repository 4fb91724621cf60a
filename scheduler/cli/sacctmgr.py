"""`sacctmgr`, read-only: `show|list user|account|assoc|qos|cluster`, so that tools
that look up a user's account find one. The organisation is the account and its
members are the users (`GET /api/v1/associations`, `/qos`, `/config`); accounts and
members are changed in the portal, not here."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.cli.console import Command, UsageError, parse_command_line
from scheduler.slurm import policy_format as pf
from scheduler.slurm.cmdline import Arg, Option, OptionTable

if TYPE_CHECKING:
    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import CliConfig

PROG = "sacctmgr"
USAGE = """\
sacctmgr [<OPTION>] [<COMMAND>]
    Valid <OPTION> values are:
     -h or --help: equivalent to "help" command
     -n or --noheader: equivalent to "noheader" command
     -p or --parsable: output will be '|' delimited with a '|' at the end
     -P or --parsable2: output will be '|' delimited without a '|' at the end
     -Q or --quiet: equivalent to "quiet" command
     -V or --version: equivalent to "version" command

    Valid <COMMAND> values are:
     list <ENTITY> [<SPECS>]  display info of identified entity, default
                              is display all.
     show                     same as list
     version                  display tool version number.

  <ENTITY> may be "account", "association", "cluster", "qos" or "user".
  Spur's accounts are its organisations and their members: they are read-only here.
"""
R, N = Arg.REQUIRED, Arg.NONE
TABLE = OptionTable(
    [
        Option("associations", "s", N),
        Option("help", "h", N),
        Option("immediate", "i", N),
        Option("noheader", "n", N),
        Option("parsable", "p", N),
        Option("parsable2", "P", N),
        Option("quiet", "Q", N),
        Option("readonly", "r", N),
        Option("usage", "", N),
        Option("verbose", "v", N),
        Option("version", "V", N),
    ]
)
ENTITIES = {
    "user": "user",
    "users": "user",
    "account": "account",
    "accounts": "account",
    "acct": "account",
    "assoc": "assoc",
    "association": "assoc",
    "associations": "assoc",
    "qos": "qos",
    "cluster": "cluster",
    "clusters": "cluster",
}
NO_ENTITY = (
    "No valid entity in list command\n"
    'Input line must include "Account", "Association", "Cluster", "QOS" or "User"'
)
WRITES = ("add", "create", "modify", "update", "delete", "remove", "archive", "load", "dump")
# Conditions a `show` takes (`sacctmgr show user where name=alice`) -> the key they match.
CONDITIONS = {
    "name": "name",
    "names": "name",
    "user": "user",
    "users": "user",
    "account": "account",
    "accounts": "account",
    "cluster": "cluster",
    "clusters": "cluster",
}


@dataclass
class SacctmgrArgs:
    entity: str = ""
    header: bool = True
    delimiter: str | None = None
    trailing: bool = False
    where: dict[str, set[str]] = field(default_factory=dict)
    show: str = ""
    warnings: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> SacctmgrArgs:
    parsed = parse_command_line(TABLE, argv, PROG, operands=True, stop_at_operand=True)
    args = SacctmgrArgs()
    for option, _value in parsed.options:
        name = option.name
        if name in ("help", "usage"):
            args.show = "help"
        elif name == "version":
            args.show = "version"
        elif name == "noheader":
            args.header = False
        elif name == "parsable":
            args.delimiter, args.trailing = "|", True
        elif name == "parsable2":
            args.delimiter, args.trailing = "|", False
    if args.show:
        return args
    words = list(parsed.operands)
    if not words:
        raise UsageError(f"{PROG}: error: no command given (interactive mode is not supported)")
    command = words[0].lower()
    if command == "version":
        args.show = "version"
        return args
    if command == "help":
        args.show = "help"
        return args
    if command in WRITES:
        raise UsageError(
            f"{PROG}: error: {command}: accounts and users are read-only here: Spur's accounts "
            "are its organisations and their members, managed in the portal"
        )
    if command not in ("show", "list"):
        raise UsageError(f"invalid keyword: {words[0]}")
    if len(words) < 2 or words[1].lower() not in ENTITIES:
        raise UsageError(NO_ENTITY)
    args.entity = ENTITIES[words[1].lower()]
    for word in words[2:]:
        if word.lower() in ("where", "set"):
            continue
        key, eq, value = word.partition("=")
        condition = CONDITIONS.get(key.lower())
        if not eq or condition is None:
            raise UsageError(f" Unknown condition: {word}\n Use keyword 'set' to modify value")
        values = {v.strip() for v in value.split(",") if v.strip()}
        args.where.setdefault(condition, set()).update(values)
    return args


def _matches(where: Mapping[str, set[str]], values: Mapping[str, str]) -> bool:
    return all(not wanted or values.get(key, "") in wanted for key, wanted in where.items())


Cells = Callable[[Mapping[str, Any]], dict[str, str]]


def run(args: SacctmgrArgs, config: CliConfig, client: ApiClient) -> int:
    columns: Sequence[tuple[str, int]]
    rows: list[dict[str, str]] = []
    if args.entity == "qos":
        columns = pf.QOS_COLUMNS
        for q in client.pages("api/v1/qos"):
            if _matches(args.where, {"name": str(q.get("name", ""))}):
                rows.append(pf.qos_cells(q))
    elif args.entity == "cluster":
        columns = pf.CLUSTER_COLUMNS
        settings = client.object("GET", "api/v1/config").get("config") or {}
        name = str(settings.get("ClusterName", ""))
        qos = sorted(str(q.get("name", "")) for q in client.pages("api/v1/qos"))
        if _matches(args.where, {"name": name, "cluster": name}):
            rows.append(pf.cluster_cells(name, qos))
    else:
        associations = client.pages("api/v1/associations")
        cells: Cells
        if args.entity == "user":
            columns, cells = pf.USER_COLUMNS, pf.user_cells
            associations = [a for a in associations if a.get("user")]
        elif args.entity == "account":
            columns, cells = pf.ACCOUNT_COLUMNS, pf.account_cells
            associations = [a for a in associations if not a.get("user")]
        else:
            columns, cells = pf.ASSOC_COLUMNS, pf.association_cells
        for a in associations:
            values = {
                "name": str(a.get("user") or a.get("account") or ""),
                "user": str(a.get("user") or ""),
                "account": str(a.get("account") or ""),
                "cluster": str(a.get("cluster") or ""),
            }
            if _matches(args.where, values):
                rows.append(cells(a))
    lines = pf.format_sacctmgr(
        columns, rows, header=args.header, delimiter=args.delimiter, trailing=args.trailing
    )
    for line in lines:
        print(line)
    return 0


COMMAND = Command(PROG, USAGE, lambda argv: parse_args(argv, os.environ), run)
main = COMMAND.main
script = COMMAND.script
