"""One task of a running job, started beside it: a step's task (agents/steps.py) or the
web terminal's shell (agents/terminal.py).

    spurd ─▶ supervisor (agents/supervisor.py, in <spool>/steps/<job>.<attempt>.<step>.<rank>)
               └─▶ setpriv (the job's identity) ─▶ bwrap (a sandbox of its own, the job's
                   workspace and GPUs' device nodes) ─▶ TASK_SHELL ─▶ the command

Contained as the job is: the job's identity, its organisation's workspace, its GPUs'
device nodes only, bound to its CPUs and put in its cgroup (so it shares the job's memory
and pids limits) before it runs, under a supervisor that the node's fencing lease kills.
Its stdio are pipes (a step's output stream), or a terminal's slave side.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.cdi import device_nodes
from agents.jobprocess import JobProcess, as_identity, pid_namespace
from agents.launch_request import LaunchError
from agents.limits import JobLimits
from agents.sandbox import DeviceNode, SandboxJob, data_fd, device_groups, environment_fd
from agents.supervisor import supervised

if TYPE_CHECKING:
    from agents.launcher import Launcher

# The task's shell inside its sandbox: limits, its working directory, then the command
# (arguments, never shell text).
TASK_SHELL = """\
{limits}
cd -- "$1" 2>/dev/null || {{ echo "srun: error: cannot enter the directory $1" >&2; exit 1; }}
shift
exec "$@"
"""


@dataclass
class JobTask:
    rank: int
    local: int
    monitor: subprocess.Popen[bytes]  # its supervisor
    process: JobProcess  # its sandbox, signalled as a job's is
    taskdir: Path  # its supervisor's directory in the spool (status, lease FIFO)
    status: tuple[int, int] | None = None


def task_devices(cdi: Any, gpus: Sequence[int]) -> list[DeviceNode]:
    """The device nodes of these GPUs that exist here (a simulated GPU has none)."""
    found = device_nodes(cdi, list(gpus))
    return [DeviceNode(host, path) for host, path in found if os.path.exists(host)]


def start_task(
    launcher: Launcher,
    taskdir: Path,
    identity: Any,
    files: Any,
    limits: JobLimits,
    devices: list[DeviceNode],
    cwd_argv: list[str],
    env: dict[str, str],
    *,
    rank: int,
    local: int,
    cpus: frozenset[int],
    stdin: bytes = b"",
    tty: int | None = None,
    stdio: tuple[int, int, int] | None = None,
    cgroup: str,
) -> JobTask:
    """One task of the job (a step's, or the web terminal's shell): its own sandbox as
    the job's identity, under its own supervisor (in `taskdir`), bound to `cpus`, in the
    job's cgroup (`cgroup`, the name the launcher gave it).
    `cwd_argv`: the directory it starts in, then its command. With `tty` (a terminal's
    slave side) that is its stdin, stdout and stderr; with `stdio` those three descriptors
    (an SSH command's pipes, agents/ssh.py); otherwise pipes."""
    taskdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    shell = TASK_SHELL.format(limits="\n".join(launcher.limits.shell(limits)))
    command = ["/bin/sh", "-c", shell, "spurd-task", *cwd_argv]
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    block_r, block_w = os.pipe2(os.O_CLOEXEC)
    script_fd = data_fd(b"", "spur-step")
    tools = launcher.tool_files()
    env_fd = environment_fd(env)
    theirs = (info_w, block_r, script_fd, *(fd for fd, _ in tools), env_fd)
    job = SandboxJob(
        identity=identity,
        workspace=files.workspace,
        command=command,
        env=env,
        script_fd=script_fd,
        info_fd=info_w,
        block_fd=block_r,
        devices=devices,
        files=tools,
        env_fd=env_fd,
        links=launcher.tool_links(),
    )
    wrapped = as_identity(identity, device_groups(devices, identity), launcher.sandbox.wrap(job))
    lease = None if launcher.lease is None else launcher.lease.left()
    wrapped = supervised(taskdir, lease, theirs, wrapped)
    piped: int = subprocess.PIPE
    if tty is not None:
        stdio = (tty, tty, tty)
    elif stdio is None:
        stdio = (piped if stdin else subprocess.DEVNULL, piped, piped)
    try:
        monitor = subprocess.Popen(
            wrapped,
            env={},
            cwd="/",
            stdin=stdio[0],
            stdout=stdio[1],
            stderr=stdio[2],
            pass_fds=theirs,
            # A session leader's `set -m` (the supervisor's) takes a terminal on its
            # stdio for its own controlling terminal, and the shell could then not:
            # with a terminal, only a process group of its own.
            start_new_session=tty is None,
            process_group=0 if tty is not None else None,
        )
    except OSError as exc:
        _close(*theirs, info_r, block_w)
        raise LaunchError(f"cannot start the sandbox: {exc}") from exc
    _close(*theirs)
    try:
        info = _read_all(info_r)
        init_pid = int(json.loads(info)["child-pid"])
        pidfd = os.pidfd_open(init_pid)
        process = JobProcess(init_pid, monitor.pid, pid_namespace(init_pid), pidfd, ready=True)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        _close(block_w)
        monitor.kill()
        err = monitor.stderr.read().decode(errors="replace") if monitor.stderr else ""
        monitor.wait()
        raise LaunchError(f"the task's sandbox did not start: {err.strip() or exc}") from None
    finally:
        _close(info_r)
    try:
        if cpus:
            os.sched_setaffinity(init_pid, cpus)
        # In the job's own cgroup: the step shares the job's memory and pids limits.
        launcher.limits.attach(cgroup, init_pid, limits)
        os.write(block_w, b"1")
    except OSError as exc:
        process.kill()
        monitor.kill()
        monitor.wait()
        process.reap()
        raise LaunchError(f"cannot prepare the task's sandbox: {exc}") from exc
    finally:
        _close(block_w)
    if stdin and monitor.stdin is not None:
        threading.Thread(target=_feed, args=(monitor.stdin, stdin), daemon=True).start()
    return JobTask(rank, local, monitor, process, taskdir)


def _feed(pipe: Any, data: bytes) -> None:
    """srun's stdin to task 0, then its end (a task that does not read it is no error)."""
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _read_all(fd: int) -> bytes:
    data = bytearray()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(data)
        data += chunk


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = ["TASK_SHELL", "JobTask", "data_fd", "start_task", "task_devices"]
