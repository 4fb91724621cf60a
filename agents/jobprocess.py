"""One job's processes as the agent holds them: started in their sandbox, signalled, ended.

    spurd ══▶ job supervisor ─fork─▶ (the job's uid, gid, groups) ─exec─▶ bwrap
              (agents/jobsupervisor.py)                 (the monitor, outside the sandbox)
        └─▶ init (pid 1 of the job's PID namespace)
              └─▶ first shell ─exec─▶ batch script ─▶ ...

The node's job supervisor starts the monitor and is its parent (`monitor` below is the
agent's handle on it, its status is bwrap's): it writes the job's status into the spool
when the job ends and fences the job when the node's lease runs out, whether or not the
agent that asked for the job still runs.

Starting: the monitor reports the init's pid on the info pipe and holds the sandbox
back until the agent writes to the block pipe; in between, the agent opens a pidfd on
the init, binds it to the job's CPUs and puts it in the job's cgroup, so the first shell
and all it starts inherit both. The first shell writes one byte to its stdout (the ready
pipe) once the job's files are open, just before it becomes the script; anything it or
bwrap say before that goes to the error pipe and becomes the reason the launch failed.

Signals go to every process of the job's PID namespace (the init's descendants, found
through /proc) except its init, which has nothing to do with them: a job that called
setsid() still gets them, and the monitor, which would die of them and lose the exit
status, does not. SIGKILL goes to the init alone: when a namespace's init dies the
kernel kills everything in it, and the init is only a zombie (its pidfd readable) once
they are all gone, which is when the job has left the node. The monitor exits as soon
as the script does; what the script left running is then killed the same way
(slurmstepd's rule).

The monitor's status is the script's, except that a death by signal n reads as 128+n
(bwrap's init reports it so). The agent knows which signals it delivered: 128+n with n
among them is taken for that signal, and any other status for an exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal as signals
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from agents.identity import Identity
from agents.sandbox import DeviceNode, Sandbox, SandboxJob, data_fd, environment_fd
from agents.supervisor import SETPRIV, Supervised

_MAX_ERRORS = 64 * 1024
_GONE_S = 10.0  # a sandbox that failed to start is gone in far less
# Starts a batch job's sandbox: its command line and descriptors (number in the job:
# descriptor here), run as the job's identity by the node's job supervisor.
Spawn = Callable[[list[str], dict[int, int]], Supervised]
# scontrol suspend and resume, where the job has no cgroup to freeze.
_SUSPENDING = frozenset({signals.SIGSTOP, signals.SIGCONT})


class SandboxError(Exception):
    """The sandbox could not be started; the message says why (the job fails with it)."""


def process_start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (-1 if there is no such pid).

    With the pid it names one process for the life of the machine: a recycled pid has
    a different start time. A zombie keeps its start time.
    """
    stat = _proc_stat(pid)
    return -1 if stat is None else stat[1]


def still_running(pid: int, start_time: int) -> bool:
    """Whether the process started at `start_time` as `pid` runs (and is no zombie)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[1] == start_time and stat[0] not in ("Z", "X")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    # A descriptor and bytes, not a text file object: read for every launch, and by the
    # watchers of adopted jobs every second.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = data.rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[19])


def _pid_namespace(pid: int) -> tuple[int, int]:
    info = os.stat(f"/proc/{pid}/ns/pid")
    return info.st_dev, info.st_ino


pid_namespace = _pid_namespace  # the PID namespace of a process: (device, inode)
_OWN_NAMESPACE = _pid_namespace(os.getpid())
# Whether the kernel lists each thread's children (CONFIG_PROC_CHILDREN).
_CHILDREN = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")
_WALKS = 3


def as_identity(identity: Identity, groups: Sequence[int], argv: Sequence[str]) -> list[str]:
    """`argv` run as `identity` (its groups and `groups` besides), or as it is when the
    identity is already ours (personal mode)."""
    if (identity.uid, identity.gid) == (os.geteuid(), os.getegid()):
        return list(argv)
    extra = ",".join(str(g) for g in dict.fromkeys([*identity.groups, *groups]))
    return [
        SETPRIV,
        f"--reuid={identity.uid}",
        f"--regid={identity.gid}",
        f"--groups={extra}" if extra else "--clear-groups",
        # Nothing the job execs may gain a privilege (setuid binaries do nothing), and
        # no capability survives, in any set: the job is the account and nothing more.
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *argv,
    ]


def decode_status(returncode: int, delivered: Collection[int]) -> tuple[int, int]:
    """`(exit_code, signal)` of a job from its monitor's status (see the docstring)."""
    if returncode < 0:
        return 0, -returncode
    if returncode > 128 and returncode - 128 in delivered:
        return 0, returncode - 128
    return returncode, 0


@dataclass
class JobProcess:
    init_pid: int
    monitor_pid: int
    namespace: tuple[int, int]
    pidfd: int
    monitor: Supervised | None = None  # None: adopted from an earlier agent, or a task
    ready_fd: int = -1
    errors_fd: int = -1
    init_start: int = -1
    monitor_start: int = -1
    ready: bool = False  # the script runs (or, adopted, ran when this agent started)
    delivered: set[int] = field(default_factory=set)
    # Signals sent before the script ran: the namespace may hold only its init then, so
    # they would reach nobody. They go out as soon as the script is about to run.
    _pending: list[int] = field(default_factory=list)
    # Held while the pidfd is used from another thread (signals) and when it is closed:
    # a closed descriptor's number may be reused for another job's.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- starting -------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        sandbox: Sandbox,
        *,
        identity: Identity,
        workspace: str,
        command: Sequence[str],
        env: dict[str, str],
        script: bytes,
        devices: Sequence[DeviceNode],
        prepare: Callable[[int], None],
        spawn: Spawn,
        files: Sequence[tuple[int, str]] = (),
        links: Sequence[tuple[str, str]] = (),
        dirs: Sequence[tuple[str, str]] = (),
        make_dir: str = "",
    ) -> JobProcess:
        """Start the job's sandbox through `spawn`; `prepare(init_pid)` runs before the
        job does. `make_dir`: the job's own run directory, made in its sandbox."""
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        block_r, block_w = os.pipe2(os.O_CLOEXEC)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
        ours = [info_r, block_w, ready_r, errors_r]
        script_fd = data_fd(script, "spur-script")
        env_fd = environment_fd(env)
        theirs = [info_w, block_r, ready_w, errors_w, script_fd, env_fd, *(f for f, _ in files)]
        # The numbers they get in the sandbox's monitor, which its command line names:
        # from 3 up (the job supervisor's `TARGETS`), stdout the ready pipe and stderr
        # the error pipe.
        fds = {1: ready_w, 2: errors_w, 3: info_w, 4: block_r, 5: script_fd, 6: env_fd}
        numbered = [(7 + n, path) for n, (_, path) in enumerate(files)]
        fds.update((number, fd) for (number, _), (fd, _) in zip(numbered, files, strict=True))
        job = SandboxJob(
            identity=identity,
            workspace=workspace,
            command=command,
            env=env,
            script_fd=5,
            info_fd=3,
            block_fd=4,
            devices=devices,
            files=numbered,
            env_fd=6,
            links=links,
            dirs=dirs,
            make_dir=make_dir,
        )
        argv = sandbox.wrap(job)
        try:
            monitor = spawn(argv, fds)
        except OSError as exc:
            _close(*theirs, *ours)
            raise SandboxError(f"cannot start the sandbox: {exc.strerror or exc}") from exc
        _close(*theirs)
        pidfd = -1
        try:
            info = _read_all(info_r)
            try:
                init_pid = int(json.loads(info)["child-pid"])
            except (ValueError, KeyError, TypeError):
                monitor.wait(_GONE_S)
                raise SandboxError(_reason(_read_all(errors_r))) from None
            pidfd = os.pidfd_open(init_pid)  # it waits on the block pipe: alive, not reaped
            namespace = _pid_namespace(init_pid)
            if namespace == _OWN_NAMESPACE:
                raise SandboxError("the sandbox has no PID namespace of its own")
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(monitor.pid, signals.SIGKILL)
            monitor.wait(_GONE_S)
            _close(pidfd, block_w, *ours)
            raise
        finally:
            _close(info_r)
        process = cls(init_pid, monitor.pid, namespace, pidfd, monitor, ready_r, errors_r)
        process.monitor_start = monitor.start
        try:
            prepare(init_pid)
            os.write(block_w, b"1")
        except OSError as exc:
            process.reap()
            raise SandboxError(f"cannot prepare the job's sandbox: {exc}") from exc
        finally:
            _close(block_w)
        return process

    @classmethod
    def adopt(cls, text: str) -> JobProcess | None:
        """The job an earlier agent started, from its pid file, if its init still runs."""
        init_pid, init_start, monitor_pid, monitor_start = (int(v) for v in text.split())
        if not still_running(init_pid, init_start):
            return None
        try:
            pidfd = os.pidfd_open(init_pid)
            namespace = _pid_namespace(init_pid)
        except OSError:
            return None
        if process_start_time(init_pid) != init_start or namespace == _OWN_NAMESPACE:
            os.close(pidfd)  # not the init we started (or no namespace of its own)
            return None
        return cls(
            init_pid,
            monitor_pid,
            namespace,
            pidfd,
            init_start=init_start,
            monitor_start=monitor_start,
            ready=True,
        )

    def pid_file(self) -> str:
        """What `adopt` takes: the pids, with their start times (read after the job was
        let go, off the path to its start)."""
        if self.init_start < 0:
            self.init_start = process_start_time(self.init_pid)
        if self.monitor_start < 0:
            self.monitor_start = process_start_time(self.monitor_pid)
        return f"{self.init_pid} {self.init_start} {self.monitor_pid} {self.monitor_start}\n"

    def wait_ready(self) -> bool:
        """True once the script runs; False when the sandbox or the first shell failed
        (`errors()` then says why)."""
        try:
            ready = os.read(self.ready_fd, 1) == b"1"
        finally:
            _close(self.ready_fd)
            self.ready_fd = -1
        with self._lock:
            self.ready = ready
            if ready and self._pending:
                self._signal_members(self._pending)
            self._pending.clear()
        return ready

    def errors(self) -> str:
        """What bwrap and the first shell said before failing (read once they are gone)."""
        return _reason(_read_all(self.errors_fd, limit=_MAX_ERRORS))

    # -- signals and ending ----------------------------------------------------------

    def signal(self, signum: int, *, then_continue: bool = False) -> bool:
        """Deliver `signum` to the job, and SIGCONT right after with `then_continue` (a
        stopped job acts on an ending signal only once continued): one pass over the
        job's processes for both. False when the job is gone."""
        if signum == signals.SIGKILL:
            return self.kill()
        sequence = [signum, signals.SIGCONT] if then_continue else [signum]
        with self._lock:
            if not self.alive():
                return False
            if signum not in _SUSPENDING:  # they end nothing: the status cannot show them
                self.delivered.add(signum)
            if self.ready:
                self._signal_members(sequence)
            else:
                self._pending.extend(sequence)
        return True

    def _signal_members(self, sequence: Sequence[int]) -> None:
        signalled: set[int] = set()
        # Found through the init's descendants, a process whose parent ended during the
        # walk was being adopted by the init and may have been missed: walked again
        # until a walk finds nobody new (a scan of all /proc sees everyone at once).
        for _ in range(_WALKS if _CHILDREN else 1):
            found = [pid for pid in self._members() if pid not in signalled]
            if not found:
                return
            for pid in found:
                signalled.add(pid)
                with contextlib.suppress(OSError):
                    pidfd = os.pidfd_open(pid)
                    try:
                        # The pidfd pins the process: if it is still in the namespace
                        # now, the signal reaches it and no stranger that took its pid.
                        if _pid_namespace(pid) == self.namespace:
                            for signum in sequence:
                                signals.pidfd_send_signal(pidfd, signum)
                    finally:
                        os.close(pidfd)

    def kill(self, *, delivered: bool = True) -> bool:
        """SIGKILL the namespace's init, and so all of the job. `delivered`: a signal sent
        to the job (not the clean-up after its script ended), which its status may show."""
        with self._lock:
            if self.pidfd < 0:
                return False
            if delivered:
                self.delivered.add(signals.SIGKILL)
            try:
                signals.pidfd_send_signal(self.pidfd, signals.SIGKILL)
            except ProcessLookupError:
                return False
            return True

    def alive(self) -> bool:
        return self.pidfd >= 0 and not select.select([self.pidfd], [], [], 0)[0]

    def wait_gone(self, timeout: float | None = None) -> bool:
        """Until the init has ended, and with it every process of the job."""
        return bool(select.select([self.pidfd], [], [], timeout)[0])

    def wait_monitor(self) -> None:
        """Until the monitor has ended (the script did) and its status is recorded."""
        assert self.monitor is not None
        self.monitor.wait()

    def monitor_running(self) -> bool:
        return still_running(self.monitor_pid, self.monitor_start)

    def reap(self) -> int | None:
        """The monitor's status once it and the whole job are gone (None: its supervisor
        died without recording it); releases the fds."""
        if self.kill(delivered=False):
            self.wait_gone()
        returncode = self.monitor.wait() if self.monitor is not None else 1
        with self._lock:
            _close(self.pidfd, self.ready_fd, self.errors_fd)
            self.pidfd = self.ready_fd = self.errors_fd = -1
        return returncode

    def _members(self) -> list[int]:
        """The processes that may be the job's but its init (`_signal_members` checks
        each): the init's descendants, since every process of a PID namespace is one
        (an orphan is adopted by the namespace's init); else every process of the node,
        where the kernel does not list a process's children. A stat of every process
        cost each signal 0.9 ms with 130 processes on the node, and more with more."""
        if _CHILDREN:
            return _descendants(self.init_pid)
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == self.init_pid:
                continue
            with contextlib.suppress(OSError):
                if _pid_namespace(int(name)) == self.namespace:
                    found.append(int(name))
        return found


def _descendants(root: int) -> list[int]:
    """The processes below `root`, from each of their threads' list of the children it
    started (/proc/<pid>/task/<tid>/children)."""
    found: list[int] = []
    seen = {root}
    pending = [root]
    while pending:
        pid = pending.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone
        for tid in threads:
            try:
                fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                children = _read_all(fd)
            except OSError:
                continue
            finally:
                os.close(fd)
            for child in map(int, children.split()):
                if child not in seen:  # a pid reused during the walk
                    seen.add(child)
                    found.append(child)
                    pending.append(child)
    return found


def _read_all(fd: int, *, limit: int | None = None) -> bytes:
    data = bytearray()
    while limit is None or len(data) < limit:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _reason(errors: bytes) -> str:
    """The last thing bwrap or the first shell said, without the shell's "sh: 3: "."""
    lines = [line.strip() for line in errors.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return "the sandbox ended before the job started"
    last = lines[-1]
    parts = last.split(": ", 2)
    if len(parts) == 3 and parts[1].isdigit():  # dash: "/bin/sh: 4: cannot create x: ..."
        last = parts[2]
    return last


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
