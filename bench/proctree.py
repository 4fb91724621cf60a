"""CPU seconds of processes and of what they started, from /proc (bench/e2e.py,
bench/agent_launch.py).

A process's own (user and system), and the share of the processes it started: its reaped
children's (which include theirs), and every descendant's that still runs, so that a
process that outlives its parent's wait (a job's supervisor, the node's job supervisor)
is counted where it was started. Exact at each instant: a descendant that ends moves
from the second sum into its parent's reaped children.
"""

from __future__ import annotations

import contextlib
import os
import time


def cpu_seconds(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    """For each named pid: (its own CPU seconds, those of the processes it started)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    own: dict[int, float] = {}
    reaped: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parents[pid] = int(fields[1])
        own[pid] = (int(fields[11]) + int(fields[12])) / tick
        reaped[pid] = (int(fields[13]) + int(fields[14])) / tick
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    out: dict[str, tuple[float, float]] = {}
    for name, root in pids.items():
        if root not in own:
            continue
        started, pending = reaped[root], list(children.get(root, ()))
        while pending:
            pid = pending.pop()
            started += own[pid] + reaped[pid]
            pending += children.get(pid, ())
        out[name] = (own[root], started)
    return out


class Cgroup:
    """A cgroup of its own (root only) for a process and everything it starts: their CPU
    in all, including what no parent of theirs reaps (a bubblewrap sandbox's init is
    reaped by the machine's init: its namespaces' teardown is counted in no tree above).
    `made()` is None where none can be made (not root, no cpuacct or cgroup2 mount)."""

    def __init__(self, path: str, usage: str) -> None:
        self.path = path
        self._usage = usage

    @classmethod
    def made(cls, name: str) -> Cgroup | None:
        for root, usage in (
            ("/sys/fs/cgroup/cpuacct", "cpuacct.usage"),  # v1: nanoseconds
            ("/sys/fs/cgroup/unified", "cpu.stat"),  # a hybrid's v2
            ("/sys/fs/cgroup", "cpu.stat"),  # v2 only
        ):
            if not os.path.exists(os.path.join(root, "cgroup.procs")):
                continue
            path = os.path.join(root, f"{name}-{os.getpid()}")
            try:
                os.mkdir(path)
            except OSError:
                continue
            if os.path.exists(os.path.join(path, usage)):
                return cls(path, usage)
            os.rmdir(path)
        return None

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def cpu_seconds(self) -> float:
        with open(os.path.join(self.path, self._usage)) as f:
            text = f.read()
        if self._usage == "cpuacct.usage":
            return int(text) / 1e9
        fields = dict(line.split() for line in text.splitlines())
        return int(fields["usage_usec"]) / 1e6

    def remove(self, wait_s: float = 10.0) -> None:
        """Once every process in it has ended (the node's job supervisor outlives the
        agent a moment); one still in use after `wait_s` is left."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)
                return
            time.sleep(0.05)
