"""What every command does around its work: reach the API, say what went wrong the way
Slurm's commands do (`prog: error: ...`), and know who "me" is."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence

from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig, ConfigMissing, load_config

SLURM_VERSION = "slurm 22.05.8"

ClientFactory = Callable[[CliConfig], ApiClient]


class UsageError(Exception):
    """A bad command line: the message is printed as is, and the command exits 1."""


def error(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)


def connect(
    prog: str, environ: Mapping[str, str] | None = None, factory: ClientFactory = ApiClient
) -> tuple[CliConfig, ApiClient] | None:
    """The configuration and a client, or None after telling the user why not."""
    try:
        config = load_config(environ)
    except ConfigMissing as exc:
        error(prog, str(exc))
        return None
    return config, factory(config)


def answered(show: str, usage: Sequence[str], warnings: Sequence[str] = ()) -> bool:
    """`--version` and `--usage`/`--help` answer by themselves (True: the command is done);
    otherwise the parse warnings go to stderr first, as Slurm prints them."""
    if show == "version":
        print(SLURM_VERSION)
        return True
    if show:
        print("\n".join(usage))
        return True
    for warning in warnings:
        print(warning, file=sys.stderr)
    return False
