"""`sbatch`: submit a batch script to Spur through the web API."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from scheduler.cli.api import ApiClient
from scheduler.cli.clusters import choose
from scheduler.cli.config import CliConfig
from scheduler.cli.console import Command, UsageError, error
from scheduler.core.contract import JobState
from scheduler.rpc.errors import NotFound, Refused, RpcError, Unauthorized
from scheduler.slurm.batchscript import SbatchError
from scheduler.slurm.refusal import refusal_lines
from scheduler.slurm.sbatch_options import USAGE, SbatchRequest, parse_sbatch
from scheduler.slurm.states import TERMINAL

PROG = "sbatch"


def parse(argv: list[str]) -> SbatchRequest:
    try:
        request = parse_sbatch(
            argv,
            environ=os.environ,
            cwd=os.getcwd(),
            read_stdin=sys.stdin.read,
            hostname=socket.gethostname(),
        )
    except SbatchError as exc:
        raise UsageError("\n".join(exc.lines), exc.exit_code) from exc
    if request.quiet:
        request.warnings = []
    return request


def run(request: SbatchRequest, config: CliConfig, client: ApiClient) -> int:
    assert request.spec is not None  # parse_sbatch gives a spec unless asked to show
    body = request.spec.to_dict()
    # Who submits is the token's business: the web API stamps tenant and user.
    body.pop("tenant", None)
    body.pop("user", None)
    cluster: str | None = ""
    if request.clusters is not None:
        cluster = choose(PROG, request.clusters, client)
        if cluster is None:
            return 1
    try:
        job = client.submit_job(body)
    except Unauthorized:
        raise
    except Refused as exc:
        partition, verbose = request.spec.partition, bool(request.verbose)
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


def wait_for_job(
    client: ApiClient,
    job_id: int,
    *,
    sleep: Callable[[float], None] = time.sleep,
    first_poll_s: float = 2.0,
    max_poll_s: float = 10.0,
) -> int:
    """`--wait`: poll until the job ends, then exit as it did."""
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
    code = job.get("exit_code")
    if job.get("signal") or code is None:
        return 0 if job.get("state") == JobState.COMPLETED else 1
    if int(code) == 0 and job.get("state") != JobState.COMPLETED:
        return 1
    return int(code)
