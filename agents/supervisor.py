"""The agent's side of supervision: its handle on the node's job supervisor, each task's
own supervisor, the node's fencing lease, and the spool files they share.

A batch job runs under the node's job supervisor (agents/jobsupervisor.py: one process
for all of them, started by `JobSupervisor` here). A job's tasks (a step's, the web
terminal's shell, an SSH session: agents/jobtask.py) each run under a supervisor of their
own, this small shell of the agent's side that outlives the agent:

    spurd ─vfork─▶ supervisor (bash, the agent's identity, a session of its own)
                     ├─▶ setpriv ─exec─▶ bwrap --die-with-parent ... (the task)
                     └─▶ lease watcher (a subshell)

In the spirit of slurmstepd, it holds what must not depend on the agent's main process:

- **The job's exit.** The supervisor is the sandbox monitor's parent, so it alone sees
  the script's status the moment it ends, whether or not an agent runs then, and writes
  it to `<jobdir>/status` in the spool (the agent's, never visible inside a sandbox: a
  job cannot write another's, nor its own). It exits with that same status, which is
  what the agent that started it reads; an agent started later (it adopted the job)
  reads the file. Signals the agent delivers are appended to `<jobdir>/signals`, so
  that either agent tells a death by a delivered signal from an exit code (see
  `decode_status`).
- **The fencing lease.** With a lease, the watcher waits on the FIFO `<jobdir>/lease` for
  renewals: each is a line with the seconds the lease has left, written by the agent
  after each heartbeat the controller's leader acknowledged (`Lease`). When the lease
  runs out before a renewal (the agent is paused, wedged, dead, or cannot reach the
  leader) the watcher writes `<jobdir>/fenced` and SIGKILLs the sandbox's monitor, whose
  death takes the whole sandbox down (bwrap's `--die-with-parent`). No clock is read: a
  renewal carries what is left, and `read -t` times the rest. The controller gives the
  node's GPUs to others only after `node_timeout_s`, longer than the lease plus the
  margin to kill (scheduler/config.py, `check_fencing`).

- **A step task's output** (agents/steps.py). A task writes into FIFOs in its spool
  directory, which an agent that restarts opens again by name; so that they outlive the
  agent, the supervisor holds a reader of each (`hold`, never given to the job): a task
  writing while no agent reads blocks, it does not die of SIGPIPE. Once the task has
  ended, the supervisor waits (at most RELEASE_S) for the agent to say, through the
  FIFO `<dir>/release`, that it has read everything left in them: the task's last
  output is not lost with the pipes when it ends while no agent runs.

A task's supervisor costs it one bash start and two forks (~3 ms of CPU); the watcher
waits in a builtin (no process per tick). A batch job's costs it a fork of the job
supervisor (agents/jobsupervisor.py), which records the job's facts in its record
(agents/jobrecord.py) rather than in the files named here.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.jobsupervisor import BOOT, FENCED, LEASE_SUFFIX, MAX_MESSAGE, PRUNE, STATUS

BASH = "/bin/bash"
SIGNALS = "signals"
LEASE = "lease"
RELEASE = "release"
# How long a supervisor that holds a task's streams waits, once its task has ended, for
# an agent to read what is left in them: the longest an agent may take to come back.
RELEASE_S = 600
# util-linux's: it changes identity and execs bwrap, for a job's tasks (agents/jobtask.py;
# a batch job takes its identity in the job supervisor's fork). Popen could do it itself
# (user=, group=), but then forks the whole agent instead of vfork-ing it: 5 ms a task.
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"  # util-linux's too
_ANSWER_S = 30.0  # how long a launch waits for the job supervisor to start its job

# $1 the job's spool directory, $2 the lease's seconds ("": no fencing), $3 the
# descriptors that are the job's alone (closed here once it has them), $4 those the
# supervisor holds and the job never gets, then the job's command line. `set -m`: the
# job gets its own process group, and SIGINT and SIGQUIT are not ignored in it, as they
# would be in a background job of a non-interactive shell. The watcher kills the job's
# monitor only while it is still this supervisor's child (its pid cannot have been
# reused). No signal is trapped: bash's `wait` can report -1 for a job that ended as a
# trapped signal arrived.
SUPERVISOR = """\
set -m
dir=$1 lease=$2 fds=$3 hold=$4
shift 4
shut=
for fd in $hold; do shut="$shut $fd>&-"; done
eval '"$@"'"$shut"' &'
job=$!
for fd in $fds; do eval "exec $fd>&-"; done
exec </dev/null >/dev/null 2>&1
watcher=
if [ -n "$lease" ]; then
  (
    for fd in $hold; do eval "exec $fd>&-"; done
    left=$lease
    if exec {renewals}<>"$dir/lease"; then
      while read -r -t "$left" -u "$renewals" next; do left=$next; done
    fi
    read -r stat < "/proc/$job/stat" || exit 0
    set -- $stat
    [ "$4" = "$$" ] || exit 0
    : > "$dir/fenced"
    kill -KILL "$job"
  ) &
  watcher=$!
fi
wait "$job"
status=$?
[ -z "$watcher" ] || kill "$watcher"
# Open before the status is written: the agent releases it once it has read the status.
[ -z "$hold" ] || exec {release}<>"$dir/release"
printf '%d\\n' "$status" > "$dir/status"
[ -z "$hold" ] || read -r -t {release_s} -u "$release" _
exit "$status"
""".replace("{release_s}", str(RELEASE_S))


def supervised(
    jobdir: Path,
    lease_s: float | None,
    fds: Iterable[int],
    argv: Sequence[str],
    *,
    hold: Sequence[int] = (),
) -> list[str]:
    """`argv` under its supervisor (see the docstring). `hold`: descriptors the supervisor
    keeps open and the job never gets (it then waits for its release once the job has
    ended)."""
    lease = "" if lease_s is None else _seconds(lease_s)
    if lease_s is not None:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(jobdir / LEASE, 0o600)
    if hold:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(jobdir / RELEASE, 0o600)
    closing = " ".join(str(fd) for fd in fds)
    held = " ".join(str(fd) for fd in hold)
    return [BASH, "-c", SUPERVISOR, "spurd-supervisor", str(jobdir), lease, closing, held, *argv]


def release(jobdir: Path) -> bool:
    """Let a supervisor that holds a task's streams exit: its task has ended and the
    agent has read what they held. False when none waits (yet, or any more)."""
    try:
        fd = os.open(jobdir / RELEASE, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"\n")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@dataclass
class Supervised:
    """A batch job the job supervisor started, as the agent holds it: its sandbox's
    monitor (pid and start time), and the monitor's status once it ended (as a shell's
    $? reads it; None: the job supervisor died first, and the job with it)."""

    pid: int
    start: int
    status: int | None = None
    fenced: bool = False
    _ended: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait(self, timeout: float | None = None) -> int | None:
        """The status, once the monitor ended and its status was written down."""
        self._ended.wait(timeout)
        return self.status


@dataclass
class _Answer:
    message: dict[str, Any] | None = None
    job: Supervised | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _mount_namespace_allowed() -> bool:
    """Whether `unshare --mount` works here: root, with CAP_SYS_ADMIN, and no seccomp
    filter against it (a container's root often has neither). Tried, not guessed: a
    supervisor whose unshare failed would not start, and with it no job."""
    if os.geteuid() != 0 or not os.path.exists(UNSHARE):
        return False
    try:
        tried = subprocess.run(
            [UNSHARE, "--mount", "--propagation", "slave", "--", "/bin/true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return tried.returncode == 0


class JobSupervisor:
    """The agent's handle on its job supervisor (agents/jobsupervisor.py), started at
    the first `spawn`, and started again if it died."""

    def __init__(self, directory: Path, lease_left: Callable[[], float | None]) -> None:
        """`directory`: where job supervisors keep their lease FIFOs (in the spool).
        `lease_left`: the seconds the node's lease has left now (None: no fencing)."""
        self.directory = directory
        self._lease_left = lease_left
        self._lock = threading.Lock()  # starting it, sending to it
        self._state = threading.Lock()  # what waits on it, below
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._next = 0
        self._answers: dict[int, _Answer] = {}
        self._jobs: dict[int, Supervised] = {}

    @property
    def pid(self) -> int | None:
        """The job supervisor's pid while this agent holds one (for its CPU figures)."""
        return self._process.pid if self._process is not None and self._sock else None

    def spawn(
        self,
        *,
        directory: Path,
        argv: Sequence[str],
        identity: tuple[int, int, Sequence[int]] | None,
        fds: Mapping[int, int],
    ) -> Supervised:
        """Start `argv` for the job whose spool directory is `directory`, as `identity`
        (uid, gid, groups; None: this agent's own), with `fds` (the number it has in
        the job, 0 to 2 or one of agents/jobsupervisor.py's `TARGETS`: the descriptor
        here; stdin is /dev/null unless given). OSError if it cannot."""
        uid, gid, groups = identity if identity is not None else (None, None, ())
        request = {"op": "spawn", "dir": str(directory), "argv": list(argv), "uid": uid,
                   "gid": gid, "groups": list(groups), "targets": list(fds)}  # fmt: skip
        answer = _Answer()
        with self._lock:
            sock = self._started()
            with self._state:
                self._next += 1
                request["id"] = ident = self._next
                self._answers[ident] = answer
            try:
                socket.send_fds(sock, [marshal.dumps(request)], list(fds.values()))
            except OSError:
                with self._state:
                    self._answers.pop(ident, None)
                raise
        if not answer.done.wait(_ANSWER_S):
            with self._state:
                self._answers.pop(ident, None)
            raise OSError(f"the job supervisor did not answer in {_ANSWER_S:.0f}s")
        if answer.job is None:
            message = answer.message or {}
            raise OSError(str(message.get("error") or "the job supervisor is gone"))
        return answer.job

    def renew(self, left_s: float) -> None:
        """Tell every job supervisor of this spool (this agent's, and those an earlier
        agent left running with jobs) that the node's lease has `left_s` seconds left."""
        line = f"{_seconds(left_s)}\n".encode()
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if not name.endswith(LEASE_SUFFIX):
                continue
            path = self.directory / name
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                # Nobody reads it: its supervisor was killed before it could remove it.
                pid = name[: -len(LEASE_SUFFIX)]
                if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    path.unlink(missing_ok=True)
                continue
            try:
                os.write(fd, line)
            except OSError:
                pass
            finally:
                os.close(fd)

    def close(self) -> None:
        """Let the job supervisor go: it keeps the jobs it started until they end, then
        exits (their ends are then in their status files only)."""
        with self._lock:
            if self._sock is not None:
                # shutdown, not close alone: it wakes the reader blocked on the socket.
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def _started(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lease = self._lease_left()
        root = str(Path(__file__).resolve().parents[1])
        # A mount namespace of its own, where it detaches what no sandbox binds from
        # (agents/jobsupervisor.py `_prune_mounts`), where one can be made.
        own_mounts = _mount_namespace_allowed()
        argv = [sys.executable, "-I", "-S", "-c", BOOT, root, str(self.directory),
                "" if lease is None else _seconds(lease), str(theirs.fileno()),
                *([PRUNE] if own_mounts else [])]  # fmt: skip
        if os.path.exists(SETPRIV):
            # No privilege to gain at exec, for it and every job it starts (it keeps
            # what it holds, which it needs to give each job its identity).
            argv = [SETPRIV, "--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all",
                    "--", *argv]  # fmt: skip
        if own_mounts:
            argv = [UNSHARE, "--mount", "--propagation", "slave", "--", *argv]
        try:
            process = subprocess.Popen(
                argv,
                env={},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        finally:
            theirs.close()
        data = ours.recv(MAX_MESSAGE)
        if not data or marshal.loads(data).get("op") != "ready":
            ours.close()
            process.wait()
            raise OSError("the job supervisor did not start (the agent's log says why)")
        self._sock, self._process = ours, process
        threading.Thread(
            target=self._read, args=(ours, process), name="spurd-supervisor", daemon=True
        ).start()
        return ours

    def _read(self, sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
        """Answers and ends, from the job supervisor, until it is gone."""
        # Received into: a buffer made for each message is a megabyte mapped and unmapped.
        buffer = bytearray(MAX_MESSAGE)
        while True:
            try:
                size = sock.recv_into(buffer)
            except OSError:
                size = 0
            if not size:
                break
            message = marshal.loads(memoryview(buffer)[:size])
            ident = message.get("id")
            with self._state:
                if message.get("op") == "ended":
                    job = self._jobs.pop(ident, None)
                    if job is not None:
                        job.status, job.fenced = int(message["status"]), bool(message["fenced"])
                        job._ended.set()
                    continue
                answer = self._answers.pop(ident, None)
                if message.get("op") == "started":
                    job = Supervised(int(message["pid"]), int(message["start"]))
                    self._jobs[ident] = job
                    if answer is not None:
                        answer.job = job
            if answer is not None:
                answer.message = message
                answer.done.set()
        # It is gone, and every sandbox it started with it (--die-with-parent).
        with self._lock, self._state:
            if self._sock is sock:
                self._sock = None
            for answer in self._answers.values():
                answer.done.set()
            self._answers.clear()
            for job in self._jobs.values():
                job._ended.set()
            self._jobs.clear()
        sock.close()
        process.wait()


def supervisors_of(jobdir: Path) -> list[int]:
    """The live shell supervisors of the job whose spool directory is `jobdir` (found by
    their command line, which names it), for an agent that lost track of them."""
    found = []
    wanted = f"spurd-supervisor\0{jobdir}\0".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if wanted in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def record_signal(jobdir: Path, signum: int) -> None:
    """Note that the agent delivered `signum` to the task (for any later agent)."""
    with contextlib.suppress(OSError), open(jobdir / SIGNALS, "a") as f:
        f.write(f"{signum}\n")


def delivered_signals(jobdir: Path) -> set[int]:
    try:
        text = (jobdir / SIGNALS).read_text()
    except OSError:
        return set()
    return {int(word) for word in text.split() if word.isdigit()}


def read_status(jobdir: Path) -> int | None:
    """The status the supervisor wrote when the task ended; None if it wrote none."""
    try:
        text = (jobdir / STATUS).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def fenced(jobdir: Path) -> bool:
    return (jobdir / FENCED).exists()


def renew(jobdirs: Iterable[Path], left_s: float) -> None:
    """Tell the watchers of these jobs that their lease has `left_s` seconds left."""
    line = f"{_seconds(left_s)}\n".encode()
    for jobdir in jobdirs:
        try:
            fd = os.open(jobdir / LEASE, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # no watcher (yet, or any more): nothing to renew
        try:
            os.write(fd, line)
        except OSError:
            pass
        finally:
            os.close(fd)


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


class Lease:
    """The node's fencing lease, as the agent holds it: valid until `expires`
    (time.monotonic). Renewed from the time a heartbeat was *sent*, so that it never
    outlasts what the leader, which noted the heartbeat later, counts."""

    def __init__(self) -> None:
        self._expires: float | None = None
        self.epoch = 0  # the node's, as the leader last said (see Node.epoch)
        self._lock = threading.Lock()

    def renew(self, *, sent_at: float, lease_s: float, epoch: int = 0) -> None:
        with self._lock:
            self.epoch = max(self.epoch, epoch)
            expires = sent_at + lease_s
            if self._expires is None or expires > self._expires:
                self._expires = expires

    def left(self) -> float:
        """Seconds left (0 when it ran out or was never granted)."""
        with self._lock:
            if self._expires is None:
                return 0.0
            return max(self._expires - time.monotonic(), 0.0)
