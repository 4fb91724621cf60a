"""Each job's supervisor: a small process of the agent's side that outlives the agent.

    spurd ─vfork─▶ supervisor (bash, the agent's identity, a session of its own)
                     ├─▶ setpriv ─exec─▶ bwrap --die-with-parent ... (the job, as in
                     │                    agents/jobprocess.py)
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

The supervisor costs the launch one bash start (~2 ms); the watcher is started after the
job and waits in a builtin (no process per tick).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

BASH = "/bin/bash"
STATUS = "status"
SIGNALS = "signals"
FENCED = "fenced"
LEASE = "lease"
RELEASE = "release"
# How long a supervisor that holds a task's streams waits, once its task has ended, for
# an agent to read what is left in them: the longest an agent may take to come back.
RELEASE_S = 600

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


def supervisors_of(jobdir: Path) -> list[int]:
    """The live supervisors of the job whose spool directory is `jobdir` (found by their
    command line, which names it), for an agent that lost track of them."""
    wanted = f"spurd-supervisor\0{jobdir}\0".encode()
    found = []
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
    """Note that the agent delivered `signum` to the job (for any later agent)."""
    with contextlib.suppress(OSError), open(jobdir / SIGNALS, "a") as f:
        f.write(f"{signum}\n")


def delivered_signals(jobdir: Path) -> set[int]:
    try:
        text = (jobdir / SIGNALS).read_text()
    except OSError:
        return set()
    return {int(word) for word in text.split() if word.isdigit()}


def read_status(jobdir: Path) -> int | None:
    """The status the supervisor wrote when the job ended; None if it wrote none."""
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
