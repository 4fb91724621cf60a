"""One task of a running job, started beside it: a step's task (agents/steps.py) or the
web terminal's shell (agents/terminal.py).

    spurd ─▶ supervisor (agents/supervisor.py, in <spool>/steps/<job>.<attempt>.<step>/<rank>)
               └─▶ setpriv (the job's identity) ─▶ bwrap (a sandbox of its own, the job's
                   workspace and GPUs' device nodes) ─▶ TASK_SHELL ─▶ the command

Contained as the job is: the job's identity, its organisation's workspace, its GPUs'
device nodes only, bound to its CPUs and put in its cgroup (so it shares the job's memory
and pids limits) before it runs, under a supervisor that the node's fencing lease kills.
Its stdio are what the caller opened: a step task's FIFOs (agents/step_io.py), a
terminal's slave side, or an SSH command's pipes.

A task outlives the agent that started it, as a batch job does: `task.json` in its
directory names its processes (`JobProcess.pid_file`), and `adopt_task` takes it over
after a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal as signals
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.cdi import device_nodes
from agents.jobprocess import JobProcess, as_identity, decode_status, pid_namespace
from agents.launch_request import LaunchError
from agents.limits import JobLimits
from agents.sandbox import DeviceNode, SandboxJob, data_fd, device_groups, environment_fd
from agents.step_io import TERMINAL_OPEN
from agents.supervisor import (
    delivered_signals,
    fenced,
    read_status,
    record_signal,
    release,
    supervised,
)

if TYPE_CHECKING:
    from agents.launcher import Launcher

# The task's shell inside its sandbox: limits, its terminal (srun --pty:
# agents/step_io.py), its working directory, then the command (arguments, never shell
# text).
TASK_SHELL = """\
{limits}
{terminal}
cd -- "$1" 2>/dev/null || {{ echo "srun: error: cannot enter the directory $1" >&2; exit 1; }}
shift
exec "$@"
"""


TASK_RECORD = "task.json"


@dataclass
class JobTask:
    rank: int
    local: int
    monitor: subprocess.Popen[bytes] | None  # its supervisor; None: adopted after a restart
    process: JobProcess  # its sandbox, signalled as a job's is
    taskdir: Path  # its supervisor's directory in the spool (status, lease FIFO)
    status: tuple[int, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more of its record (task.json)

    def signal(self, signum: int) -> bool:
        """Deliver `signum` to the task (recorded for an agent that adopts it later)."""
        if self.status is not None or not self.process.signal(signum):
            return False
        if signum not in (signals.SIGSTOP, signals.SIGCONT):  # they end nothing
            record_signal(self.taskdir, signum)
        return True

    def gone(self) -> bool:
        """Whether its sandbox has ended, and with it everything the task started."""
        return not self.process.alive()

    def ended(self, *, wait_s: float = 5.0) -> tuple[int, int]:
        """(exit code, signal) once the sandbox has ended: its supervisor's record (it
        writes it the moment its sandbox's monitor exits), read once; the supervisor is
        then let go. A task whose supervisor left no status (it was killed itself) ended
        with exit code 1 (a false failure is safer than a false success)."""
        if self.status is not None:
            return self.status
        status = read_status(self.taskdir)
        deadline = time.monotonic() + wait_s
        while status is None and self._supervisor_runs() and time.monotonic() < deadline:
            time.sleep(0.01)
            status = read_status(self.taskdir)
        delivered = self.process.delivered | delivered_signals(self.taskdir)
        if fenced(self.taskdir):
            self.status = (0, 9)
        elif status is None:
            self.status = (1, 0)
        else:
            self.status = decode_status(status, delivered)
        release(self.taskdir)
        if self.monitor is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.monitor.wait(timeout=wait_s)
        self.process.reap()
        return self.status

    def _supervisor_runs(self) -> bool:
        if self.monitor is not None:
            return self.monitor.poll() is None
        return self.process.monitor_running()

    def record(self, **extra: Any) -> None:
        """Write down what an agent needs to adopt the task (after it has started)."""
        self.extra.update(extra)
        data = {
            "rank": self.rank,
            "local": self.local,
            "processes": self.process.pid_file(),
            **self.extra,
        }
        tmp = self.taskdir / f".{TASK_RECORD}.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.taskdir / TASK_RECORD)


def adopt_task(taskdir: Path) -> JobTask | None:
    """A task an earlier run of this agent started, from its record; None without one.
    Its sandbox may have ended while no agent watched: it is then `gone()`, and its
    supervisor's status says how it ended."""
    try:
        data = json.loads((taskdir / TASK_RECORD).read_text())
        rank, local, pid_text = int(data["rank"]), int(data["local"]), str(data["processes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        process = JobProcess.adopt(pid_text)
    except ValueError:
        return None
    init_pid, init_start, monitor_pid, monitor_start = (int(v) for v in pid_text.split())
    if process is None:
        # Its sandbox ended: a stand-in that is gone, to read its status with.
        process = JobProcess(init_pid, monitor_pid, (0, 0), -1, init_start=init_start,
                             monitor_start=monitor_start, ready=True)  # fmt: skip
    process.delivered.update(delivered_signals(taskdir))
    extra = {k: v for k, v in data.items() if k not in ("rank", "local", "processes")}
    return JobTask(rank, local, None, process, taskdir, extra=extra)


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
    tty: int | None = None,
    stdio: tuple[int, int, int] | None = None,
    hold: Sequence[int] = (),
    errors: int | None = None,
    terminal: bool = False,
    cgroup: str,
) -> JobTask:
    """One task of the job (a step's, or the web terminal's shell): its own sandbox as
    the job's identity, under its own supervisor (in `taskdir`), bound to `cpus`, in the
    job's cgroup (`cgroup`, the name the launcher gave it).
    `cwd_argv`: the directory it starts in, then its command. With `tty` (a terminal's
    slave side) that is its stdin, stdout and stderr; otherwise the descriptors `stdio`
    (stdin, stdout, stderr). `hold`: descriptors its supervisor keeps (see
    agents/supervisor.py), which the task never gets; the caller closes its own copies.
    `errors`: a non-blocking read end of its stderr, where a sandbox that fails says why.
    `terminal`: the task waits for its terminal, /dev/pts/0 of its sandbox, and runs on
    it (the caller makes it: agents/step_io.py `open_terminal`)."""
    if (tty is None) == (stdio is None):
        raise ValueError("a task has a terminal or its own stdio, one of them")
    taskdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    shell = TASK_SHELL.format(
        limits="\n".join(launcher.limits.shell(limits)), terminal=TERMINAL_OPEN if terminal else ""
    )
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
        dirs=launcher.tool_dirs(),
    )
    wrapped = as_identity(identity, device_groups(devices, identity), launcher.sandbox.wrap(job))
    lease = None if launcher.lease is None else launcher.lease.left()
    wrapped = supervised(taskdir, lease, theirs, wrapped, hold=hold)
    if tty is not None:
        stdio = (tty, tty, tty)
    assert stdio is not None
    try:
        monitor = subprocess.Popen(
            wrapped,
            env={},
            cwd="/",
            stdin=stdio[0],
            stdout=stdio[1],
            stderr=stdio[2],
            pass_fds=(*theirs, *hold),
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
        monitor.wait()
        release(taskdir)
        reason = _said(errors) or str(exc)
        raise LaunchError(f"the task's sandbox did not start: {reason}") from None
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
        release(taskdir)
        monitor.wait()
        process.reap()
        raise LaunchError(f"cannot prepare the task's sandbox: {exc}") from exc
    finally:
        _close(block_w)
    return JobTask(rank, local, monitor, process, taskdir)


def _said(fd: int | None) -> str:
    """The last line a task that could not start wrote to `fd` (a non-blocking read end
    of its stderr), if anything."""
    if fd is None:
        return ""
    try:
        text = os.read(fd, 65536).decode(errors="replace").strip()
    except OSError:
        return ""
    return text.splitlines()[-1] if text else ""


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


__all__ = ["TASK_SHELL", "JobTask", "adopt_task", "data_fd", "start_task", "task_devices"]
