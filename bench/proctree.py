"""CPU seconds of processes and of what they started, from /proc (bench/e2e.py,
bench/agent_launch.py).

A process's own (user and system), and the share of the processes it started: its reaped
children's (which include theirs), and every descendant's that still runs, so that a
process that outlives its parent's wait (a job's supervisor, the node's job supervisor)
is counted where it was started. Exact at each instant: a descendant that ends moves
from the second sum into its parent's reaped children.
"""

from __future__ import annotations

import os


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
