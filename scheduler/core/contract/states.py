"""A job's states: each with Slurm's compact code, a label, and the kind of state it is.

The kind is the one grouping every layer needs: whether the job is still active (it
waits or holds resources) or over, and how it ended. squeue and sacct print the value
and the code; the history's database constraint, the API's enum and the portal's badges
(`state-<kind>`) are all built from these classes.

They are enums to the type checker and to every reader, written as `enum.StrEnum`s are,
but built on strenum.py's small stand-in: the Slurm commands import this module at
start-up, and would otherwise pay for the enum module (about a third of the
interpreter's own start).
"""

from __future__ import annotations

from scheduler.core.contract.strenum import StrEnum

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the CLI reads this
if TYPE_CHECKING:
    from typing import Any


class StateKind(StrEnum):
    WAITING = "waiting"  # pending: holds nothing yet
    RUNNING = "running"  # holds resources (running, suspended, or stopping)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # ended by its own failure or the platform's (exit, time, node)
    STOPPED = "stopped"  # ended by someone: cancelled, preempted


class JobState(StrEnum):
    """Members are in Slurm's `job_states` order (squeue's default sort follows it)."""

    code: str
    label: str
    kind: StateKind

    def __new__(cls, value: str, *info: Any) -> JobState:
        # `JobState("PENDING")` looks a member up by value and never gets here; the
        # members' definitions below do, with their code, label and kind.
        member = str.__new__(cls, value)
        member._value_ = value
        member.code, member.label, member.kind = info
        return member

    PENDING = "PENDING", "PD", "Pending", StateKind.WAITING
    RUNNING = "RUNNING", "R", "Running", StateKind.RUNNING
    COMPLETING = "COMPLETING", "CG", "Completing", StateKind.RUNNING
    # scontrol suspend: stopped (SIGSTOP, or its cgroup frozen), its resources kept.
    SUSPENDED = "SUSPENDED", "S", "Suspended", StateKind.RUNNING
    COMPLETED = "COMPLETED", "CD", "Completed", StateKind.SUCCEEDED
    CANCELLED = "CANCELLED", "CA", "Cancelled", StateKind.STOPPED
    FAILED = "FAILED", "F", "Failed", StateKind.FAILED
    TIMEOUT = "TIMEOUT", "TO", "Timeout", StateKind.FAILED
    NODE_FAIL = "NODE_FAIL", "NF", "Node failure", StateKind.FAILED
    PREEMPTED = "PREEMPTED", "PR", "Preempted", StateKind.STOPPED
    OUT_OF_MEMORY = "OUT_OF_MEMORY", "OOM", "Out of memory", StateKind.FAILED

    @property
    def is_active(self) -> bool:
        return self.kind in (StateKind.WAITING, StateKind.RUNNING)

    @property
    def is_terminal(self) -> bool:
        return not self.is_active

    @property
    def holds_resources(self) -> bool:
        return self.kind is StateKind.RUNNING


ACTIVE = frozenset(s for s in JobState if s.is_active)
TERMINAL = frozenset(s for s in JobState if s.is_terminal)
HOLDS_RESOURCES = frozenset(s for s in JobState if s.holds_resources)

__all__ = ["ACTIVE", "HOLDS_RESOURCES", "TERMINAL", "JobState", "StateKind"]
