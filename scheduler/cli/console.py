"""What every command does around its work, once: parse the command line, answer
`--version`/`--usage`/`--help` and the parse warnings, reach the API, and say what went
wrong the way Slurm's commands do (`prog: error: ...`).

A command is a `Command`: its name and usage, a parser that raises `UsageError`, and a
`run` that does the work with a client. `main = COMMAND.main` runs it on a command line
and returns its exit status (what the tests call); `script = COMMAND.script` is its
console script, which ends the process as soon as the work is done (`exit_now`).
"""

from __future__ import annotations

import gc
import os
import sys

from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig, ConfigMissing, load_config
from scheduler.rpc.errors import RpcError
from scheduler.slurm import cmdline

# Every command imports this module, so it imports neither `typing` nor `dataclasses`
# (with `inspect`, a third of the interpreter's own start): what only the type checker
# reads stays behind TYPE_CHECKING (tests/scheduler/cli/test_startup.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Generic, NoReturn, Protocol, TypeVar

    class Parsed(Protocol):
        """What every command's parsed arguments say besides the work itself."""

        show: str  # "version", "usage", "help" (printed, nothing else done) or ""
        warnings: list[str]  # printed to stderr before the work

    A = TypeVar("A", bound=Parsed)
    ClientFactory = Callable[[CliConfig], ApiClient]
else:

    class Generic:  # `Command[A]` is for the type checker only
        def __class_getitem__(cls, item):
            return cls

    A = None

SLURM_VERSION = "slurm 22.05.8"


class UsageError(Exception):
    """A bad command line: the message is printed as is, and the command exits
    `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def parse_command_line(
    table: cmdline.OptionTable,
    argv: Sequence[str],
    prog: str,
    *,
    operands: bool = False,
    stop_at_operand: bool = False,
) -> cmdline.Parsed:
    """`argv` read against `table`, a bad option answered as Slurm's commands answer it;
    unless the command takes `operands`, one is an unrecognized option."""
    try:
        parsed = table.parse(argv, stop_at_operand=stop_at_operand)
    except cmdline.GetoptError as exc:
        raise UsageError(f'{prog}: {exc}\nTry "{prog} --help" for more information') from exc
    if parsed.operands and not operands:
        raise UsageError(f"{prog}: error: Unrecognized option: {parsed.operands[0]}")
    return parsed


def split_names(text: str) -> set[str]:
    """A comma-separated option value (`-u a,b`, `-p gpu`) as a set of its names."""
    return {item.strip() for item in text.split(",") if item.strip()}


def error(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)


def print_lines(lines: Sequence[str]) -> None:
    """Print lines as `print` would, in one write: 10,000 rows cost one call, not 10,000."""
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")


def exit_now(code: int) -> NoReturn:
    """End the process with `code`, its output written, and skip the interpreter's own
    teardown: freeing every object one by one (sacct's 20,000 lines and their columns)
    costs a command milliseconds for nothing, as the process's memory goes whole. Only
    for a command that has done all its work: no thread of its own is left running."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        die_of_sigpipe()
    except ValueError:  # closed
        pass
    try:  # noqa: SIM105 (contextlib.suppress: an import every command would pay)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def die_of_sigpipe() -> NoReturn:
    """End as Slurm's own commands end when their reader went away (`sacct | head`):
    by SIGPIPE, quietly, with no traceback."""
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(128 + signal.SIGPIPE)  # not reached: the signal ends the process


def connect(
    prog: str, environ: Mapping[str, str] | None = None, factory: ClientFactory | None = None
) -> tuple[CliConfig, ApiClient] | None:
    """The configuration and a client, or None after telling the user why not."""
    try:
        config = load_config(environ)
    except ConfigMissing as exc:
        error(prog, str(exc))
        return None
    return config, (factory or ApiClient)(config)


def _online(args: object) -> str | None:
    return None


def answered(show: str, usage: str, warnings: Sequence[str] = ()) -> bool:
    """`--version` and `--usage`/`--help` answer by themselves (True: the command is done);
    otherwise the parse warnings go to stderr first, as Slurm prints them."""
    if show == "version":
        print(SLURM_VERSION)
        return True
    if show:
        print(usage.rstrip("\n"))
        return True
    for warning in warnings:
        print(warning, file=sys.stderr)
    return False


class Command(Generic[A]):
    """A command: its name and usage, its parser, its work, and an answer that needs no
    server (sacct --helpformat: a string, or None to go on)."""

    __slots__ = ("offline", "parse", "prog", "run", "usage")

    def __init__(
        self,
        prog: str,
        usage: str,
        parse: Callable[[list[str]], A],
        run: Callable[[A, CliConfig, ApiClient], int],
        offline: Callable[[A], str | None] | None = None,
    ) -> None:
        self.prog, self.usage, self.parse, self.run = prog, usage, parse, run
        self.offline = offline or _online

    def main(self, argv: Sequence[str] | None = None) -> int:
        try:
            args = self.parse(list(sys.argv[1:] if argv is None else argv))
        except UsageError as exc:
            print(exc, file=sys.stderr)
            return exc.exit_code
        text = self.offline(args)
        if text is not None:
            print(text)
            return 0
        if answered(args.show, self.usage, args.warnings):
            return 0
        connected = connect(self.prog)
        if connected is None:
            return 1
        config, client = connected
        try:
            return self.run(args, config, client)
        except RpcError as exc:
            error(self.prog, exc.message)
            return 1
        finally:
            client.close()

    def script(self) -> NoReturn:
        """The console script: `main` on the process's command line, then `exit_now`. A
        reader that went away (`sacct | head`) ends it as it ends Slurm's commands: by
        SIGPIPE, quietly.

        The collector's young passes come every 100,000 new objects, not 700: each one
        walked the lists the command holds (sacct's columns and lines, 20,000 rows each)
        again, 28 passes and ~8 ms of a sacct over 10,000 jobs, for cycles a command that
        ends in a moment never needs collected. A command that runs on (`sbatch --wait`,
        `spur output -f`) still collects, every 100,000."""
        gc.set_threshold(100_000)
        try:
            code = self.main()
        except BrokenPipeError:
            die_of_sigpipe()
        exit_now(code)
