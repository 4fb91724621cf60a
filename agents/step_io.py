"""A step task's streams on its node: what lets them outlive the agent (agents/steps.py).

    <spool>/steps/<job>.<attempt>.<step>/<rank>/
        stdout, stderr   FIFOs the task writes (its stdout and stderr)
        stdin            FIFO it reads: a task that gets srun's input (-i)
        out.<k>, err.<k> the journal: what the agent read from them, in segments of
                         SEGMENT bytes, segment k holding the stream's bytes from
                         k * SEGMENT on
        stdin.at         how many bytes of srun's input were written to it, and "eof"

A task writes into FIFOs, not files: a task that writes faster than srun reads blocks
(the pipe fills while the agent reads nothing), as a Slurm task does, and the node's
disk holds at most RETAIN + BACKLOG + SEGMENT of each stream. The agent copies each FIFO
into the journal, at most BACKLOG bytes ahead of where srun's stream has reached, and
streams from the journal at the offsets srun names: srun reconnects after a restart of
the agent (or of the web between them) and goes on where it stopped, without losing or
repeating a byte. The journal keeps RETAIN bytes behind that point for a stream that
was lost in flight (what sockets and the web relay hold is far less); a client that
asks for older bytes is told how many are lost.

The output FIFOs have a reader held by the task's supervisor (agents/supervisor.py):
with no agent reading they fill up, and nobody dies of SIGPIPE. The stdin FIFO has a
writer held by a small holder process (`hold`): the task does not read an end of input
when the agent goes away (the agent opens a writer for each piece it writes), and reads
it once the agent has released the holder, at the end of srun's input.
A `--pty` task's terminal is made in its sandbox's own devpts, so that it is
/dev/pts/0 there (`tty` says so; a terminal of the host's would be bound at
/dev/console): the task's shell waits for it (TERMINAL_OPEN), the agent opens the
sandbox's ptmx through /proc/<init>/root once bubblewrap has mounted it, hands the
slave to the job's identity, and reads and writes the master side. A holder keeps a
copy of the master, so that the terminal outlives the agent, and an agent that restarts
takes the holder's copy (pidfd_getfd).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import struct
import subprocess
import termios
import time
from pathlib import Path

from scheduler.core.contract.steps import MAX_STEP_INPUT_CHUNK

SEGMENT = 1 << 20
RETAIN = 8 << 20
BACKLOG = 1 << 20
CHUNK = 64 << 10
STDIN_AT = "stdin.at"
# The largest piece of srun's input one request carries (agent, web and srun alike).
MAX_INPUT_CHUNK = MAX_STEP_INPUT_CHUNK
# A terminal's command in its own session, with the terminal as its controlling one (so
# that ^C and window size changes reach its foreground job: bubblewrap's --new-session
# left it none); `--wait`, so that its sandbox lives as long as it does.
SETSID = shutil.which("setsid") or "/usr/bin/setsid"


class Lost(Exception):
    """The bytes asked for were dropped from the journal: the stream goes on at `at`."""

    def __init__(self, at: int) -> None:
        super().__init__(f"lost up to {at}")
        self.at = at


class Journal:
    """One output stream of a task, as the agent read it, from byte 0 of the stream."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        found = sorted(
            int(p.name.rsplit(".", 1)[1])
            for p in directory.glob(f"{name}.*")
            if p.name.rsplit(".", 1)[1].isdigit()
        )
        self.first = found[0] if found else 0
        last = found[-1] if found else 0
        self.size = last * SEGMENT + (self._path(last).stat().st_size if found else 0)
        self._fd = -1
        self._segment = -1

    def _path(self, k: int) -> Path:
        return self.directory / f"{self.name}.{k}"

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            k = self.size // SEGMENT
            if k != self._segment:
                self.close()
                self._fd = os.open(
                    self._path(k), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
                )
                self._segment = k
            piece = view[: (k + 1) * SEGMENT - self.size]
            written = os.write(self._fd, piece)
            self.size += written
            view = view[written:]

    def read(self, offset: int, limit: int = CHUNK) -> bytes:
        """Up to `limit` bytes from `offset` (fewer at a segment's end); b"" at the end.
        Raises Lost when they were dropped."""
        if offset < self.first * SEGMENT:
            raise Lost(self.first * SEGMENT)
        k = offset // SEGMENT
        count = min(limit, (k + 1) * SEGMENT - offset, self.size - offset)
        if count <= 0:
            return b""
        try:
            fd = os.open(self._path(k), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise Lost(max(self.first * SEGMENT, offset)) from None
        try:
            return os.pread(fd, count, offset - k * SEGMENT)
        finally:
            os.close(fd)

    def trim(self, below: int) -> None:
        """Drop the segments that hold nothing at or after `below`."""
        while (self.first + 1) * SEGMENT <= below and self.first < self.size // SEGMENT:
            with contextlib.suppress(FileNotFoundError):
                self._path(self.first).unlink()
            self.first += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._segment = -1, -1


def output_fifo(path: Path) -> tuple[int, int, int]:
    """A task's output FIFO at `path`: (the agent's non-blocking read end, the task's
    write end, the supervisor's read end). A read end must exist before a write end can
    be opened without blocking."""
    with contextlib.suppress(FileExistsError):
        os.mkfifo(path, 0o600)
    ours = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    held = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    task = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    return ours, task, held


def input_fifo(path: Path) -> tuple[int, int]:
    """A task's stdin FIFO at `path`: (the task's read end, the holder's write end). The
    agent writes through ends it opens for each piece (`open_input`)."""
    with contextlib.suppress(FileExistsError):
        os.mkfifo(path, 0o600)
    task = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    held = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    os.set_blocking(task, True)
    return task, held


def open_output(path: Path) -> int:
    """The agent's read end of an output FIFO again (after a restart); -1 if it is gone."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1


def open_input(path: Path) -> int | None:
    """A write end of a task's stdin FIFO; None when the task no longer reads it (no
    reader is left: it closed its stdin, or it has ended)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT):
            return None
        raise


def read_input_at(taskdir: Path) -> tuple[int, bool]:
    """(bytes of srun's input written to the task, whether its end was delivered)."""
    try:
        words = (taskdir / STDIN_AT).read_text().split()
    except OSError:
        return 0, False
    written = int(words[0]) if words and words[0].isdigit() else 0
    return written, "eof" in words[1:]


def write_input_at(taskdir: Path, written: int, eof: bool) -> None:
    tmp = taskdir / f".{STDIN_AT}.tmp"
    tmp.write_text(f"{written}{' eof' if eof else ''}\n")
    os.replace(tmp, taskdir / STDIN_AT)


# The task's side of its terminal: wait for the agent to make /dev/pts/0 and hand it
# over (agents/jobtask.py TASK_SHELL), then make it stdin, stdout and stderr.
TERMINAL_OPEN = """\
n=0
until [ -r /dev/pts/0 ] && [ -w /dev/pts/0 ]; do
  n=$((n + 1))
  [ "$n" -lt 1000 ] || { echo "srun: error: the task's terminal never came" >&2; exit 1; }
  sleep 0.01
done
exec 0<>/dev/pts/0 1>&0 2>&0
"""
TERMINAL_WAIT_S = 10.0
_TIOCSPTLCK = 0x40045431  # unlockpt(3)
_TIOCGPTN = 0x80045430  # ptsname(3)'s number
# $1 the FIFO it waits on, $2 for how long at most; what it holds is what it was given.
# It says it listens (a line on its stdout) before it waits: a release sent before would
# find no reader and be lost.
HOLDER = 'exec {release}<>"$1" && echo && exec >&- && read -r -t "$2" -u "$release" _'


def open_terminal(init_pid: int, uid: int, gid: int, size: tuple[int, int] | None) -> int:
    """The master side of a new terminal in the sandbox of `init_pid`, its /dev/pts/0
    given to `uid`:`gid` (non-blocking). Waits for bubblewrap to have mounted the
    sandbox's own devpts (its root is the host's until it has pivoted)."""
    root = f"/proc/{init_pid}/root/dev/pts"
    host = os.stat("/dev/pts").st_dev
    deadline = time.monotonic() + TERMINAL_WAIT_S
    master = -1
    while master < 0:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            if os.stat(root).st_dev != host:
                master = os.open(f"{root}/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
                break
        if time.monotonic() > deadline:
            raise OSError(errno.ETIMEDOUT, "the task's sandbox never mounted its /dev/pts")
        time.sleep(0.002)
    try:
        fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))
        (number,) = struct.unpack("I", fcntl.ioctl(master, _TIOCGPTN, b"\0\0\0\0"))
        if number != 0:  # only the task runs there yet: its terminal is the first
            raise OSError(errno.EEXIST, f"the sandbox already had a terminal (/dev/pts/{number})")
        os.chown(f"{root}/0", uid, gid)
        if size is not None:
            set_size(master, *size)
        os.set_blocking(master, False)
    except BaseException:
        os.close(master)
        raise
    return master


def hold(taskdir: Path, fd: int, what: str, release_s: float) -> subprocess.Popen[bytes]:
    """A process that keeps a copy of `fd` (by the same number) until `release(taskdir,
    what)` or `release_s` have passed: `what` is "stdin" (the FIFO's writer that keeps
    the task from reading an end of input) or "tty" (a terminal whose master side is
    closed everywhere hangs its task up)."""
    fifo = taskdir / f"release.{what}"
    with contextlib.suppress(FileExistsError):
        os.mkfifo(fifo, 0o600)
    holder = subprocess.Popen(
        ["/bin/bash", "-c", HOLDER, f"spurd-holder-{what}", str(fifo), str(int(release_s))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        pass_fds=(fd,),
        start_new_session=True,
        env={},
    )
    assert holder.stdout is not None
    with holder.stdout:
        holder.stdout.readline()  # it listens (or it failed: then nothing is held anyway)
    return holder


def release(taskdir: Path, what: str) -> None:
    """Let the holder of `what` go (none waits: nothing happens)."""
    try:
        fd = os.open(taskdir / f"release.{what}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def set_size(fd: int, cols: int, rows: int) -> None:
    """A terminal's window size, by its master side (SIGWINCH to its foreground)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


_SYS_PIDFD_GETFD = 438  # the same number on every architecture (the unified table)


def take_fd(pidfd: int, target: int) -> int:
    """A copy of descriptor `target` of the process `pidfd` names (pidfd_getfd(2), Linux
    5.6): the terminal master a task's supervisor holds, for an agent that restarted.
    Raises OSError when the kernel or the process's credentials refuse it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.syscall(_SYS_PIDFD_GETFD, pidfd, target, 0))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    os.set_inheritable(fd, False)
    return fd


__all__ = [
    "BACKLOG",
    "CHUNK",
    "HOLDER",
    "Journal",
    "Lost",
    "MAX_INPUT_CHUNK",
    "RETAIN",
    "SEGMENT",
    "SETSID",
    "TERMINAL_OPEN",
    "hold",
    "input_fifo",
    "open_input",
    "open_output",
    "open_terminal",
    "output_fifo",
    "read_input_at",
    "release",
    "set_size",
    "take_fd",
    "write_input_at",
]
