"""`sbatch`: submit a batch script to Spur through the web API."""

from __future__ import annotations

import _socket
import os
import sys
import time

from scheduler.cli.console import Command, UsageError, error
from scheduler.rpc.errors import NotFound, Refused, RpcError, Unauthorized
from scheduler.slurm.batchscript import SbatchError
from scheduler.slurm.sbatch_options import USAGE, SbatchRequest, parse_sbatch

# `sbatch --wrap true` costs the interpreter's start and one request, and little more
# (tests/scheduler/cli/test_startup.py lists what it may import): `socket`'s C half gives
# the host name, and what only `--wait` needs is imported there.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import CliConfig

PROG = "sbatch"


def parse(argv: list[str]) -> SbatchRequest:
    try:
        request = parse_sbatch(
            argv,
            environ=os.environ,
            cwd=os.getcwd(),
            read_stdin=sys.stdin.read,
            hostname=_socket.gethostname(),
        )
    except SbatchError as exc:
        raise UsageError("\n".join(exc.lines), exc.exit_code) from exc
    if request.quiet:
        request.warnings = []
    return request


def run(request: SbatchRequest, config: CliConfig, client: ApiClient) -> int:
    assert request.body is not None  # parse_sbatch gives a body unless asked to show
    # Who submits is the token's business: the web API stamps tenant and user (the body
    # has neither).
    body = request.body
    cluster: str | None = ""
    if request.clusters is not None:
        from scheduler.cli.clusters import choose

        cluster = choose(PROG, request.clusters, client)
        if cluster is None:
            return 1
    try:
        job = client.submit_job(body)
    except Unauthorized:
        raise
    except Refused as exc:
        from scheduler.slurm.refusal import refusal_lines  # only for a refusal

        partition, verbose = str(body.get("partition") or ""), bool(request.verbose)
        lines = refusal_lines(PROG, exc.message, code=exc.code, partition=partition,
                              verbose=verbose)  # fmt: skip
        print("\n".join(lines), file=sys.stderr)
        return 1
    job_id = int(job["job_id"])
    # With -M, Slurm names the cluster that took the job.
    if request.parsable:
        print(f"{job_id};{cluster}" if cluster else job_id, flush=True)
    elif not request.quiet:
        where = f" on cluster {cluster}" if cluster else ""
        print(f"Submitted batch job {job_id}{where}", flush=True)
    if request.wait:
        return wait_for_job(client, job_id)
    return 0


COMMAND = Command(PROG, USAGE, parse, run)
main = COMMAND.main
script = COMMAND.script


def wait_for_job(
    client: ApiClient,
    job_id: int,
    *,
    sleep: Callable[[float], None] = time.sleep,
    first_poll_s: float = 2.0,
    max_poll_s: float = 10.0,
) -> int:
    """`--wait`: poll until the job ends, then exit as it did."""
    from scheduler.slurm.states import TERMINAL

    interval = first_poll_s
    while True:
        try:
            job = client.get_job(job_id)
        except NotFound:
            error(PROG, f"Job {job_id} no longer exists")
            return 1
        except RpcError as exc:
            error(PROG, exc.message)
            return 1
        if str(job.get("state", "")) in TERMINAL:
            return job_exit_status(job)
        sleep(interval)
        interval = min(interval * 2, max_poll_s)


def job_exit_status(job: dict[str, Any]) -> int:
    """The exit status `sbatch --wait` returns: the script's, or 1 if it had none to give
    (killed by a signal, cancelled, timed out, its node lost)."""
    from scheduler.core.contract import JobState

    code = job.get("exit_code")
    if job.get("signal") or code is None:
        return 0 if job.get("state") == JobState.COMPLETED else 1
    if int(code) == 0 and job.get("state") != JobState.COMPLETED:
        return 1
    return int(code)
