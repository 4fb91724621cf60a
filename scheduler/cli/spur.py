"""`spur`: one entry point for the Slurm-named commands, `spur config`, `spur output`
(a job's output, read through the web API), and the operator's commands on the
controller replicas: `spur ping` and `spur raft add|remove`.

The Slurm-named commands speak to the web API; `ping` and `raft` speak to the
controllers' own API with the cluster token (an operator's, from spur.toml or
SPUR_CLUSTER_TOKEN), at the URLs of `--controller`, SPUR_CONTROLLER_URLS, or spur.toml
(`controller.listen` and the values of `controller.raft_http`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from scheduler.cli.config import ConfigMissing, load_config

if TYPE_CHECKING:
    import argparse

# The Slurm-named commands, by the module whose `main` runs each: imported when named,
# so that `spur X` costs what `X` costs.
COMMANDS: dict[str, str] = {
    "sbatch": "scheduler.cli.sbatch",
    "squeue": "scheduler.cli.squeue",
    "scancel": "scheduler.cli.scancel",
    "sinfo": "scheduler.cli.sinfo",
    "sacct": "scheduler.cli.sacct",
}


def command_main(name: str) -> Callable[[Sequence[str] | None], int]:
    main: Callable[[Sequence[str] | None], int] = importlib.import_module(COMMANDS[name]).main
    return main


USAGE = """\
usage: spur COMMAND [ARGS...]

commands:
  sbatch   submit a batch script
  squeue   list pending and running jobs
  scancel  cancel or signal jobs
  sinfo    show partitions and nodes
  sacct    show job history
  config   print the API URL the commands use, and where it came from
  output   print a job's output: spur output JOBID [-f] [--stderr]
  ping     show each controller replica: its Raft role, term, commit index, log
  raft     add or remove a controller replica: spur raft add|remove HOST:PORT
"""


def _controller_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-f", default=os.environ.get("SPUR_CONFIG"),
                        help="spur.toml (cluster token, controller URLs)")  # fmt: skip
    parser.add_argument("--controller", default=os.environ.get("SPUR_CONTROLLER_URLS", ""),
                        help="comma list of controller URLs (default: from spur.toml)")  # fmt: skip


def _controllers(args: argparse.Namespace) -> tuple[list[str], str]:
    """The controller URLs and the cluster token."""
    from scheduler import config as spur_config

    cfg = spur_config.load(args.config)
    urls = [u.strip().rstrip("/") for u in args.controller.split(",") if u.strip()]
    if not urls:
        ctl = cfg.controller
        urls = [f"http://{ctl.listen}"] + [url.rstrip("/") for _, url in ctl.raft_http]
    return list(dict.fromkeys(urls)), cfg.token


def ping(argv: Sequence[str]) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="spur ping", description=(
        "each controller replica's Raft view: role, term, commit index, log"))  # fmt: skip
    _controller_args(parser)
    parser.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    args = parser.parse_args(argv)
    from scheduler.client import ControllerClient
    from scheduler.config import ConfigError
    from scheduler.rpc.errors import RpcError

    try:
        urls, token = _controllers(args)
    except ConfigError as exc:
        print(f"spur ping: error: {exc}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    for url in urls:
        with ControllerClient([url], token, timeout=3) as client:
            try:
                info = client.call("GET", "/v1/raft")["replica"]
            except RpcError as exc:
                rows.append({"url": url, "error": str(exc)})
                continue
        rows.append({"url": url, **info})
    if args.json:
        print(json.dumps(rows))
    else:
        header = ("URL", "RAFT", "ROLE", "TERM", "COMMIT", "APPLIED", "LOG", "LEADER")
        table = [header]
        for r in rows:
            if "error" in r:
                table.append((r["url"], "-", "unreachable", "-", "-", "-", "-", r["error"][:60]))
                continue
            log = f"{r['log_first_index']}-{r['log_last_index']}"
            table.append((r["url"], r["self"], r["role"], str(r["term"]), str(r["commit_index"]),
                          str(r["last_applied"]), log, r["leader"] or "-"))  # fmt: skip
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    leaders = {r["leader"] for r in rows if r.get("leader")}
    return 0 if any(r.get("role") == "leader" for r in rows) and len(leaders) == 1 else 1


def raft(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="spur raft", description=(
        "change the controller group's membership, one replica at a time: start a new "
        "replica with every current member as its --raft-peers, then add it; remove a "
        "replica, then stop it"))  # fmt: skip
    parser.add_argument("action", choices=("add", "remove"))
    parser.add_argument("address", help="the replica's Raft address, HOST:PORT")
    _controller_args(parser)
    args = parser.parse_args(argv)
    from scheduler.client import ControllerClient
    from scheduler.config import ConfigError
    from scheduler.rpc.errors import RpcError

    try:
        urls, token = _controllers(args)
    except ConfigError as exc:
        print(f"spur raft: error: {exc}", file=sys.stderr)
        return 2
    with ControllerClient(urls, token, timeout=15, retry_for_s=15) as client:
        try:
            if args.action == "add":
                answer = client.call("POST", "/v1/raft/members", json={"address": args.address})
            else:
                answer = client.call("DELETE", f"/v1/raft/members/{args.address}")
        except RpcError as exc:
            print(f"spur raft: error: {exc}", file=sys.stderr)
            return 1
    print("members: " + ", ".join(answer["members"]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "config":
        try:
            config = load_config()
        except ConfigMissing as exc:
            print(f"spur: error: {exc}", file=sys.stderr)
            return 1
        print(config.api_url)
        print(f"# from {config.source}", file=sys.stderr)
        return 0
    if command == "output":
        from scheduler.cli import output

        return output.main(rest)
    if command == "ping":
        return ping(rest)
    if command == "raft":
        return raft(rest)
    if command not in COMMANDS:
        print(f"spur: error: unknown command {command!r}", file=sys.stderr)
        print(USAGE, end="", file=sys.stderr)
        return 2
    return command_main(command)(rest)


script = main  # its console script: it may leave threads to finish, so it returns
