"""`salloc`: hold an allocation while a command (or $SHELL) runs here, with the job's
environment; `srun` outside an allocation uses the same to run one step in a new one.

    salloc [-N n] [-n n] [--gres=gpu:k] [-G g] [-p part] [-t time] ... [command [args...]]

The allocation is a job whose batch script only waits (`HOLDER`): it is submitted
through the web API like sbatch's, and once it runs the command starts with
SLURM_JOB_ID, SLURM_NODELIST and the rest of the job environment, so that `srun` in it
runs steps on the allocated nodes (through the web API, with the user's token). When
the command exits, the allocation is given back: the holder is sent SIGTERM (it then
ends COMPLETED) or, when the command failed, SIGUSR1 (it ends FAILED, exit 1); salloc
exits as the command did. A request that can never be satisfied is refused at submit
with Slurm's words, and nothing is created.
"""

from __future__ import annotations

import os
import signal as signals
import socket
import subprocess
import sys
import time
from typing import Any

from scheduler.cli.srun import (
    ALLOCATION_OPTIONS,
    Failed,
    Options,
    Usage,
    input_source,
    open_through_web,
    parse,
    step_request,
)
from scheduler.cli.stepout import run_step
from scheduler.core.contract import JobState

PROG = "salloc"
HOLDER = "trap 'exit 0' TERM; trap 'exit 1' USR1; while :; do sleep 3600 & wait $!; done"
RELEASE_OK = int(signals.SIGTERM)
RELEASE_FAILED = int(signals.SIGUSR1)
# The job environment salloc's command gets: the allocation's, not one node's.
_NODE_KEYS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_GTIDS",
    "SLURM_NODEID",
    "SLURMD_NODENAME",
    "SLURM_CPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
)
_SBATCH_FLAGS = {
    "nodes": "--nodes",
    "ntasks": "--ntasks",
    "ntasks_per_node": "--ntasks-per-node",
    "cpus_per_task": "--cpus-per-task",
    "name": "--job-name",
    "partition": "--partition",
    "time": "--time",
    "gres": "--gres",
    "gpus": "--gpus",
    "gpus_per_node": "--gpus-per-node",
    "mem": "--mem",
    "account": "--account",
    "qos": "--qos",
    "constraint": "--constraint",
    "nodelist": "--nodelist",
    "exclude": "--exclude",
    "exclusive": "--exclusive",
}


def holder_argv(opts: Options, name: str) -> list[str]:
    """sbatch's command line for the allocation's job."""
    argv = []
    for key, flag in _SBATCH_FLAGS.items():
        value = opts.get(key)
        if key == "name" and not value:
            value = name
        if value is None or value is False:
            continue
        argv.append(flag if value is True else f"{flag}={value}")
    gpus_per_task = opts.get("gpus_per_task")
    if gpus_per_task and not any(opts.get(k) for k in ("gres", "gpus", "gpus_per_node")):
        ntasks = int(opts.get("ntasks") or 1)
        argv.append(f"--gpus={int(gpus_per_task) * ntasks}")
    return [*argv, "--output=/dev/null", "--wrap", HOLDER]


def allocate_and_run(prog: str, opts: Options, *, step: bool) -> int:
    """Allocate, run the command (salloc: here; srun: as one step there), give back."""
    from scheduler.cli.api import ApiClient
    from scheduler.cli.config import ConfigMissing, load_config
    from scheduler.rpc.errors import Refused, RpcError
    from scheduler.slurm.batchscript import SbatchError
    from scheduler.slurm.refusal import FAILED, refusal_lines
    from scheduler.slurm.sbatch_options import parse_sbatch

    command = opts.argv or [os.environ.get("SHELL") or "/bin/sh"]
    name = os.path.basename(command[0])
    source: int | None = None
    if step:  # its input file (-i) before anything is made: one it cannot open is refused
        try:
            source = input_source(opts)
        except Failed as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 1
    try:
        request = parse_sbatch(
            holder_argv(opts, name),
            environ={},
            cwd=os.getcwd(),
            read_stdin=lambda: "",
            hostname=socket.gethostname(),
        )
    except SbatchError as exc:
        # sbatch's checks, in this command's name and words (its exit code too: 255 for
        # a bad --time or --mem).
        for line in exc.lines:
            line = line.replace(
                f"sbatch: error: {FAILED['sbatch']}:", f"sbatch: error: {FAILED[prog]}:"
            )
            print(line.replace("sbatch:", f"{prog}:", 1), file=sys.stderr)
        return exc.exit_code
    assert request.spec is not None
    body = request.spec.to_dict()
    body.pop("tenant", None)
    body.pop("user", None)
    body["interactive"] = True  # its script only holds the allocation: no batch step
    try:
        config = load_config(None)
    except ConfigMissing as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    client = ApiClient(config)
    try:
        try:
            job = client.submit_job(body)
        except Refused as exc:
            lines = refusal_lines(prog, exc.message, code=exc.code,
                                  partition=request.spec.partition,
                                  verbose=bool(opts.get("verbose")))  # fmt: skip
            print("\n".join(lines), file=sys.stderr)
            return 1
        job_id = int(job["job_id"])
        if not step:
            print(f"{prog}: Pending job allocation {job_id}", file=sys.stderr)
        try:
            running = _wait_running(client, job_id, prog, quiet=step)
        except KeyboardInterrupt:
            client.act(job_id, "cancel")
            return 1
        if running is None:
            return 1
        job = running
        code = RELEASE_FAILED
        try:
            if step:
                stream = open_through_web(
                    str(job_id),
                    step_request(opts),
                    api_url=config.api_url,
                    token=config.token,
                    verbose=bool(opts.get("verbose")),
                )
                code = run_step(opts, str(job_id), stream, source=source)
            else:
                print(f"{prog}: Granted job allocation {job_id}", file=sys.stderr)
                env = {**os.environ, **allocation_environment(job)}
                code = subprocess.call(command, env=env)
                if code < 0:
                    code = 128 - code
        except Failed as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            code = 1
        except FileNotFoundError:
            print(f"{prog}: error: {command[0]}: No such file or directory", file=sys.stderr)
            code = 127
        finally:
            if not step:
                print(f"{prog}: Relinquishing job allocation {job_id}", file=sys.stderr)
            release = RELEASE_OK if code == 0 else RELEASE_FAILED
            try:
                client.act(job_id, "cancel", {"signal": release})
            except RpcError as exc:
                print(f"{prog}: error: releasing job {job_id}: {exc.message}", file=sys.stderr)
        return code
    except RpcError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _wait_running(client: Any, job_id: int, prog: str, *, quiet: bool) -> dict[str, Any] | None:
    told = False
    interval = 0.1
    while True:
        job: dict[str, Any] = client.get_job(job_id)
        state = str(job.get("state"))
        if state == JobState.RUNNING and job.get("nodes"):
            if told and not quiet:
                print(f"{prog}: job {job_id} has been allocated resources", file=sys.stderr)
            return job
        if state not in (JobState.PENDING, "CONFIGURING"):  # CONFIGURING: Slurm's only
            print(f"{prog}: error: job {job_id} ended before it ran: {state}", file=sys.stderr)
            return None
        waiting = state == JobState.PENDING and job.get("reason") not in (None, "None")
        if waiting and not told and not quiet:
            print(f"{prog}: job {job_id} queued and waiting for resources", file=sys.stderr)
            told = True
        time.sleep(interval)
        interval = min(interval * 1.5, 2.0)


def allocation_environment(job: dict[str, Any]) -> dict[str, str]:
    """The job environment of the allocation, as salloc's command sees it."""
    from scheduler.slurm.jobenv import job_environment

    nodes = list(job.get("nodes") or ())
    env = job_environment(job, str(nodes[0]), cluster_name=str(job.get("cluster") or "spur"))
    for key in _NODE_KEYS:
        env.pop(key, None)
    return env


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse(args)
    except Usage as exc:
        print(str(exc).replace("srun", PROG), file=sys.stderr)
        return exc.code
    if opts.get("version"):
        print("slurm 22.05.8")
        return 0
    if opts.get("help") or opts.get("usage"):
        print(f"Usage: {PROG} [OPTIONS(0)...] [command [args...]]")
        return 0
    for warning in opts.warnings:
        print(warning.replace("srun", PROG), file=sys.stderr)
    return allocate_and_run(PROG, opts, step=False)


__all__ = ["ALLOCATION_OPTIONS", "allocate_and_run", "allocation_environment", "main"]


script = main  # its console script: it may leave threads to finish, so it returns


if __name__ == "__main__":
    raise SystemExit(main())
