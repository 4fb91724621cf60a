"""`spur output JOBID [-f] [--stderr]`: a job's output, read through the web API
(`GET /api/v1/jobs/{id}/output?stream=&offset=`) a chunk at a time; `-f` follows it
until the job ends, like `tail -f`, and waits for a pending job to start."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig
from scheduler.cli.console import Command, UsageError
from scheduler.rpc.errors import NotFound

PROG = "spur output"
USAGE = """\
Usage: spur output [-f|--follow] [--stderr] JOBID

Print a job's standard output (or, with --stderr, its standard error).
  -f, --follow   keep printing as the job writes, until it ends
      --stderr   the job's standard error instead of its standard output
"""
POLL_S = 0.5  # between two reads while a followed job is quiet (2 requests/s at most)
MAX_JOB_ID = 2**63 - 1


@dataclass
class OutputArgs:
    job_id: int = 0
    follow: bool = False
    stream: str = "stdout"
    show: str = ""
    warnings: list[str] = field(default_factory=list)


def parse_args(argv: list[str]) -> OutputArgs:
    args = OutputArgs()
    operands: list[str] = []
    only_operands = False
    for item in argv:
        if only_operands or not item.startswith("-") or item == "-":
            operands.append(item)
        elif item == "--":
            only_operands = True
        elif item in ("-f", "--follow"):
            args.follow = True
        elif item == "--stderr":
            args.stream = "stderr"
        elif item == "--stdout":
            args.stream = "stdout"
        elif item in ("-h", "--help", "--usage"):
            args.show = "help"
        else:
            raise UsageError(f"{PROG}: error: unrecognized option '{item}'\n{USAGE.rstrip()}")
    if args.show:
        return args
    if len(operands) != 1:
        raise UsageError(f"{PROG}: error: name one job\n{USAGE.rstrip()}")
    text = operands[0]
    if not text.isdigit() or not 0 < int(text) <= MAX_JOB_ID:
        raise UsageError(f"{PROG}: error: Invalid job id: {text}")
    args.job_id = int(text)
    return args


def _not_started(client: ApiClient, job_id: int) -> bool:
    """Whether a job without output yet may still get some (it has not ended); a job
    that does not exist is the server's NotFound, passed on."""
    from scheduler.slurm.states import TERMINAL  # only a followed job that has not started

    return str(client.get_job(job_id).get("state", "")) not in TERMINAL


def follow_output(
    client: ApiClient,
    args: OutputArgs,
    *,
    out: TextIO | None = None,
    sleep: Callable[[float], None] | None = None,
    poll_s: float | None = None,
) -> int:
    """Print the job's output from the start; with `args.follow`, on until it ends."""
    out = out or sys.stdout
    pause = sleep or time.sleep
    poll_s = POLL_S if poll_s is None else poll_s
    offset = 0
    path = f"api/v1/jobs/{args.job_id}/output"
    while True:
        try:
            chunk: dict[str, Any] = client.object(
                "GET", path, params={"stream": args.stream, "offset": str(offset)}
            )
        except NotFound:
            if not args.follow or not _not_started(client, args.job_id):
                raise
            pause(poll_s)
            continue
        data = str(chunk.get("data") or "")
        if data:
            out.write(data)
            out.flush()
        following = int(chunk.get("next_offset", offset))
        progressed, offset = following > offset, following
        if progressed and offset < int(chunk.get("size", 0)):
            continue  # more is there already
        if not (args.follow and chunk.get("running")):
            return 0
        pause(poll_s)


def run(args: OutputArgs, config: CliConfig, client: ApiClient) -> int:
    try:
        return follow_output(client, args)
    except KeyboardInterrupt:
        return 130


COMMAND = Command(PROG, USAGE, parse_args, run)
main = COMMAND.main
script = COMMAND.script
