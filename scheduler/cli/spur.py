"""`spur`: one entry point for the Slurm-named commands, and `spur config`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from scheduler.cli import sacct, sbatch, scancel, sinfo, squeue
from scheduler.cli.config import ConfigMissing, load_config

COMMANDS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "sbatch": sbatch.main,
    "squeue": squeue.main,
    "scancel": scancel.main,
    "sinfo": sinfo.main,
    "sacct": sacct.main,
}

USAGE = """\
usage: spur COMMAND [ARGS...]

commands:
  sbatch   submit a batch script
  squeue   list pending and running jobs
  scancel  cancel or signal jobs
  sinfo    show partitions and nodes
  sacct    show job history
  config   print the API URL the commands use, and where it came from
"""


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
    handler = COMMANDS.get(command)
    if handler is None:
        print(f"spur: error: unknown command {command!r}", file=sys.stderr)
        print(USAGE, end="", file=sys.stderr)
        return 2
    return handler(rest)
