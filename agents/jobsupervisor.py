"""The node's job supervisor: one small process that starts the agent's batch jobs, is the
parent of their sandboxes, records how each ended, fences them when the node's lease runs
out, and outlives the agent.

    spurd ══ socket ══▶ job supervisor (python -I -S, the agent's identity, its own session)
      │                   ├─spawn─▶ (the job's identity) ─exec─▶ bwrap --die-with-parent
      │                   │                                       └─▶ init ─▶ first shell ─▶ script
      │                   └─fork─▶ ... one per batch job
      └─ <spool>/supervisor/<pid>.lease ──▶ renewals (any agent, after each heartbeat
                                            the leader acknowledged)

Like slurmstepd, and like the shell each job once had to itself, it holds what must not
depend on the agent's main process:

- **The job's exit.** It is the parent of each sandbox's monitor (bubblewrap), so it sees
  the script's status the moment it ends, whether or not an agent runs then, and appends
  it to the job's record in the spool, `<jobdir>/launch.json` (the agent's, which no
  sandbox shows: a job can write neither its own status nor another's), as a line
  `{"status": n}`. As it starts the job it appends `{"running": [pid, start time]}`, so
  that an agent that died in the middle of a launch is followed by one that finds the
  job and stops it. The agent that asked for the job hears of its end on the socket; one
  started later reads the record. (Appended to a file the agent made: a file of its own
  would cost each job an inode, which on a busy ext4 spool costs more than the fork.)
- **The fencing lease.** It holds the node's lease: each renewal is a line with the
  seconds the lease has left, written to its FIFO by the agent after each heartbeat that
  the controller's leader acknowledged (agents/supervisor.py, `Lease`). When the lease
  runs out before a renewal (the agent is paused, wedged, dead, or cannot reach the
  leader) it writes `<jobdir>/fenced` for each job and SIGKILLs each sandbox's monitor,
  whose death takes the sandbox down (bubblewrap's `--die-with-parent`); it starts
  nothing more until a renewal comes. If it dies itself, every sandbox dies with it: a
  job is never left running without a lease. No clock is read but the monotonic one: a
  renewal carries what is left.

Why one process for all jobs and not a shell each: starting a job is a fork of this small
process (one thread, a few MB of its own) whose child takes the job's identity (groups,
gid, uid) and execs bubblewrap: no shell, no `setpriv`, no lease watcher per job. The
agent cannot do that itself: its fork (a large process with threads) costs milliseconds,
and a vfork cannot change identity. The child is subprocess's (`_posixsubprocess`): no
Python runs between its fork and its exec, so it writes almost none of the pages it
shares with this process; a child that ran Python (the descriptors, the identity) cost
each job about half a millisecond more of CPU, copying the pages its reference counts
touched. A job's descriptors are placed at their numbers here, in a range this process
keeps for them (`TARGETS`, /dev/null between spawns), and kept there by the child.

**Its own mount namespace.** Where the agent is root, it starts it in a mount namespace of
its own (`unshare --mount --propagation slave`: the host's later mounts still reach it),
where it detaches, at its start, every mount under /dev, /proc and /sys (the cgroup tree,
devpts, /dev/shm, debugfs, binfmt_misc...) and keeps those three (`_prune_mounts`). A
sandbox needs none of what lay under them: bubblewrap makes each its own /dev and /proc,
the devices' nodes are /dev's own, and what GPU runtimes read of /sys is sysfs itself.
Bubblewrap reads the whole mount table again for each bind it makes, fourteen a job, so
each mount of the host cost each job fourteen lines more to read and parse: on this
project's VMs, 20 mounts became 5, and all the CPU a job costs the node fell by 0.24 to
0.85 ms (bench/agent_launch.py --batch 20, three pairs in turns: 7.4 -> 7.2 ms at the
median). A job sees /sys without what was mounted under it.

Besides that one `umount` at its start, it never execs anything itself. It is started
under `setpriv --no-new-privs` with empty inheritable and ambient capability sets, which
every job inherits: a job can gain no privilege from a setuid binary or a file capability
(its bounding set stays, since emptying it would take from this process, at its own exec,
the capabilities it needs to give jobs their identities; with `no_new_privs` it grants
nothing, and bubblewrap empties it inside the sandbox). Only the agent that started it
can ask it for a job (a socket pair, inherited); only root can renew its lease (the FIFO
lies in the spool). It imports nothing but a few modules of the standard library (it
runs as `python -I -S`: what it maps, each fork copies the page tables of).

Each agent starts its own, at its first launch; one started by an earlier agent keeps its
jobs until they end (renewed through its FIFO like the new one), then exits.

Protocol (SOCK_SEQPACKET, one dict a message in `marshal`'s format: both ends are the
same interpreter, the agent's, and marshal costs both less than json; descriptors with
SCM_RIGHTS):

    agent ─▶ {"op": "spawn", "id", "dir", "argv", "uid", "gid", "groups", "targets"}
             + one descriptor for each number in `targets` (the number it gets in the
             job: 0, 1, 2 or one of `TARGETS`); the job's stdin is /dev/null unless
             given; uid null: the agent's own identity
    agent ◀─ {"op": "ready", "pid"}                      once, at start
             {"op": "started", "id", "pid", "start"}     or {"op": "failed", "id", "error"}
             {"op": "ended", "id", "status", "fenced"}   status as a shell's $? reads it
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque

# Not `typing`'s: nothing at run time that the process does not use; mypy takes any
# TYPE_CHECKING for true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RECORD = "launch.json"  # <jobdir>/launch.json: the launch, then {"running"}, {"status"}
STATUS = "status"  # <jobdir>/status: the exit status, as a task's shell supervisor writes it
FENCED = "fenced"  # <jobdir>/fenced: the lease ran out
RUNNING = "running"
LEASE_SUFFIX = ".lease"  # <directory>/<pid>.lease: the renewals of supervisor <pid>
MAX_MESSAGE = 1 << 20  # a launch's argv is a few KB
MAX_FDS = 64  # a launch passes about twenty
# The numbers a job's descriptors may take in it besides 0, 1 and 2 (the agent numbers
# them from 3): held by /dev/null here while no job is being started, so that nothing of
# this process takes them, and a job's placed there (dup2) only while it is spawned.
TARGETS = range(3, 3 + MAX_FDS)

PRUNE = "prune"  # its last argument where it runs in a mount namespace of its own
PRUNED_UNDER = (b"/dev/", b"/proc/", b"/sys/")  # what lies under them is detached
UMOUNT = "/usr/bin/umount" if os.path.exists("/usr/bin/umount") else "/bin/umount"

# The command line that starts it, run by `python -I -S -c`: its argv are the directory
# holding this package, then `serve`'s.
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from agents.jobsupervisor import serve; serve(sys.argv[2:])"
)


class _Child:
    __slots__ = ("dir", "id", "pid", "pidfd", "process", "record")

    def __init__(
        self, process: subprocess.Popen[bytes], pidfd: int, ident: int, directory: str, record: int
    ) -> None:
        # Held until reaped: a Popen dropped while its child runs would reap it itself
        # (its __del__ polls), and its status would be lost.
        self.process = process
        self.pid = process.pid
        self.pidfd = pidfd
        self.id = ident
        self.dir = directory
        self.record = record


class _Server:
    def __init__(
        self, sock: socket.socket, renewals: int, lease_s: float | None, null: int
    ) -> None:
        self.sock = sock
        self.renewals = renewals
        # None: no lease at all (jobs are never fenced); else when it runs out.
        self.expires = None if lease_s is None else time.monotonic() + lease_s
        self.fenced = False  # the lease ran out, and no renewal came since
        self.children: dict[int, _Child] = {}  # by pidfd
        self.agent = True  # the agent's end of the socket is open
        self.outbox: deque[bytes] = deque()
        self.pending = b""  # a renewal line not yet complete
        self.null = null  # also at each of TARGETS (`serve`)
        # Received into, each request: a buffer made for each (what socket.recv_fds
        # does) is a megabyte mapped and unmapped a job.
        self.buffer = bytearray(MAX_MESSAGE)

    def run(self) -> None:
        # poll, not select: no limit on descriptor numbers (a pidfd a job).
        while self.agent or self.children:
            poller = select.poll()
            poller.register(self.renewals, select.POLLIN)
            for pidfd in self.children:
                poller.register(pidfd, select.POLLIN)
            sock = self.sock.fileno()
            if self.agent:
                poller.register(sock, select.POLLIN | (select.POLLOUT if self.outbox else 0))
            timeout = None
            if self.expires is not None and not self.fenced:
                timeout = max(self.expires - time.monotonic(), 0.0) * 1000
            events = poller.poll(timeout)
            if self.expires is not None and not self.fenced and time.monotonic() >= self.expires:
                self._fence()
            for fd, event in events:
                if fd in self.children:
                    self._reap(self.children.pop(fd))
                elif fd == self.renewals:
                    self._renewed()
                elif fd == sock and self.agent:
                    if event & select.POLLOUT:
                        self._flush()
                    if event & ~select.POLLOUT:
                        self._request()

    # Requests.

    def _request(self) -> None:
        request: Any = None
        received = array.array("i")
        try:
            size, ancillary, _, _ = self.sock.recvmsg_into(
                [self.buffer],
                socket.CMSG_SPACE(MAX_FDS * received.itemsize),
                socket.MSG_CMSG_CLOEXEC,
            )
        except OSError:
            size, ancillary = 0, []
        for level, kind, payload in ancillary:
            if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
        fds = received.tolist()
        data = memoryview(self.buffer)[:size]
        if not data:
            self.agent = False  # the agent is gone: keep the jobs, take no more
            self.outbox.clear()
            return
        try:
            request = marshal.loads(data)
            if request.get("op") != "spawn":
                raise ValueError(f"unknown request {request.get('op')!r}")
            self._spawn(request, fds)
        except Exception as exc:  # noqa: BLE001 - a bad request fails alone, never this process
            ident = request.get("id") if isinstance(request, dict) else None
            self._send({"op": "failed", "id": ident, "error": str(exc)})
        finally:
            for fd in fds:
                _close(fd)

    def _spawn(self, request: dict[str, Any], fds: list[int]) -> None:
        ident = int(request["id"])
        if self.fenced:
            raise RuntimeError("the node holds no lease: no heartbeat acknowledged")
        argv = [str(a) for a in request["argv"]]
        targets = [int(t) for t in request["targets"]]
        if len(targets) != len(fds) or not argv:
            raise ValueError(f"{len(fds)} descriptors for {len(targets)} targets")
        if len(set(targets)) != len(targets):
            raise ValueError(f"descriptor numbers given twice: {targets}")
        as_job: dict[str, Any] = {}
        if request.get("uid") is not None:
            as_job = {"user": int(request["uid"]), "group": int(request["gid"]),
                      "extra_groups": [int(g) for g in request["groups"]]}  # fmt: skip
        directory = str(request["dir"])
        record = os.open(
            f"{directory}/{RECORD}", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        standard: list[int | None] = [self.null, None, None]  # None: this process's own
        placed: list[int] = []
        try:
            for fd, target in zip(fds, targets, strict=True):
                if 0 <= target <= 2:
                    standard[target] = fd
                elif target in TARGETS:
                    os.dup2(fd, target, inheritable=False)
                    placed.append(target)
                else:
                    raise ValueError(f"descriptor number {target} is not 0-2 or in {TARGETS}")
            # Its child: the descriptors, a session of its own, SIGPIPE and SIGXFSZ as a
            # shell gives them (restore_signals), the job's groups, gid and uid, then the
            # exec; an exec that failed raises here (the job fails with its error).
            process = subprocess.Popen(
                argv, stdin=standard[0], stdout=standard[1], stderr=standard[2],
                pass_fds=placed, env={}, start_new_session=True, **as_job,
            )  # fmt: skip
        except BaseException:
            _close(record)
            raise
        finally:
            for target in placed:
                os.dup2(self.null, target, inheritable=False)
        pid = process.pid
        pidfd = os.pidfd_open(pid)
        start = _start_time(pid)
        self.children[pidfd] = _Child(process, pidfd, ident, directory, record)
        _append(record, f'{{"{RUNNING}": [{pid}, {start}]}}')
        self._send({"op": "started", "id": ident, "pid": pid, "start": start})

    # Ends.

    def _reap(self, child: _Child) -> None:
        try:
            _, status = os.waitpid(child.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            code = -int(signal.SIGKILL)
        finally:
            os.close(child.pidfd)
        child.process.returncode = code  # reaped: its Popen must not wait for it again
        # As a shell's $? reads it: 128 + n for a death by signal n.
        code = 128 - code if code < 0 else code
        _append(child.record, f'{{"{STATUS}": {code}}}')
        os.close(child.record)
        fenced = os.path.exists(f"{child.dir}/{FENCED}")
        self._send({"op": "ended", "id": child.id, "status": code, "fenced": fenced})

    # The lease.

    def _renewed(self) -> None:
        try:
            data = os.read(self.renewals, 4096)
        except BlockingIOError:
            return
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        for line in reversed(lines):  # the last complete renewal says what is left now
            try:
                left = float(line)
            except ValueError:
                continue
            if self.expires is not None and left > 0:
                self.expires = time.monotonic() + left
                self.fenced = False
            return

    def _fence(self) -> None:
        self.fenced = True
        for child in self.children.values():
            try:
                os.close(os.open(f"{child.dir}/{FENCED}", os.O_WRONLY | os.O_CREAT, 0o600))
            except OSError as exc:
                print(f"spurd-supervisor: cannot mark {child.dir} fenced: {exc}", file=sys.stderr)
            # Our own child, not reaped: its pid cannot be another process's yet.
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)

    # To the agent.

    def _send(self, message: dict[str, Any]) -> None:
        if self.agent:
            self.outbox.append(marshal.dumps(message))
            self._flush()

    def _flush(self) -> None:
        # Never blocks: a paused agent must not stop this process from fencing.
        while self.outbox:
            try:
                self.sock.send(self.outbox[0], socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return
            except OSError:
                self.agent = False
                self.outbox.clear()
                return
            self.outbox.popleft()


def _start_time(pid: int) -> int:
    # A descriptor and bytes, not a text file object: read for every job.
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    return int(data.rsplit(b")", 1)[1].split()[19])


def _append(fd: int, line: str) -> None:
    """A line of the job's record (one write: never torn by another writer)."""
    try:
        os.write(fd, f"{line}\n".encode())
    except OSError as exc:
        print(f"spurd-supervisor: cannot record a status: {exc}", file=sys.stderr)


def _prune_mounts() -> None:
    """Detach every mount under /dev, /proc and /sys, where this process is in a mount
    namespace of its own (never the one its parent, the agent, is in): see the
    docstring. Whatever fails leaves the mounts as they were."""
    try:
        if os.readlink("/proc/self/ns/mnt") == os.readlink(f"/proc/{os.getppid()}/ns/mnt"):
            return
        with open("/proc/self/mountinfo", "rb") as f:
            # Each as often as it is mounted there: one umount detaches the top one.
            points = sorted(_unescape(line.split()[4]) for line in f)
    except (OSError, IndexError, ValueError):
        return
    targets: list[bytes] = []
    for point in points:  # sorted: each mount before those under it
        if point.startswith(PRUNED_UNDER) and not any(point.startswith(t + b"/") for t in targets):
            targets.append(point)
    if targets:
        # Lazily, with what lies under each: nothing here uses them.
        subprocess.run([UMOUNT, "--recursive", "--lazy", "--", *targets], env={},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)  # fmt: skip


def _unescape(raw: bytes) -> bytes:
    """A path as /proc/self/mountinfo writes it (space, tab, newline and backslash as
    three octal digits after a backslash), as it is."""
    head, *rest = raw.split(b"\\")
    return head + b"".join(bytes([int(part[:3], 8)]) + part[3:] for part in rest)


def _above(fd: int) -> int:
    """`fd` moved above TARGETS (close-on-exec)."""
    if fd >= TARGETS.stop:
        os.set_inheritable(fd, False)
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, TARGETS.stop)
    os.close(fd)
    return moved


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def serve(args: list[str]) -> None:
    """The supervisor process: `args` are its lease directory, the lease's seconds ("":
    no fencing), the number of its socket to the agent and, where it was started in a
    mount namespace of its own, `PRUNE` (see the docstring)."""
    directory, lease, sock_fd = args[0], args[1], int(args[2])
    if args[3:4] == [PRUNE]:
        _prune_mounts()
    # The socket and /dev/null above TARGETS, then /dev/null at each of them: whatever
    # this process opens later lands above them too (the lowest free number).
    sock = socket.socket(fileno=_above(sock_fd))
    null = _above(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    for number in TARGETS:
        os.dup2(null, number, inheritable=False)
    fifo = f"{directory}/{os.getpid()}{LEASE_SUFFIX}"
    os.mkfifo(fifo, 0o600)
    try:
        renewals = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        server = _Server(sock, renewals, float(lease) if lease else None, null)
        server._send({"op": "ready", "pid": os.getpid()})
        server.run()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fifo)
