"""Effects: what the leader must do in the world after a command commits.

They carry a snapshot of what the executor needs (taken when the command was applied),
so dispatch never reads the live state from another thread. Executors are idempotent:
`Launch` by `(job_id, attempt)`, `Emit` by `seq`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Effect:
    job_id: int
    # The command that caused it: logs name it, so a launch is traceable to its submit.
    cmd_id: str = field(default="", kw_only=True, compare=False)


@dataclass(frozen=True)
class Launch(Effect):
    attempt: int
    node: str
    agent_url: str
    job: dict[str, Any] = field(default_factory=dict, compare=False)
    epoch: int = 0  # the node's (Node.epoch) when the launch was made


@dataclass(frozen=True)
class Signal(Effect):
    attempt: int
    node: str
    agent_url: str
    signal: int
    # Escalate to SIGKILL after the controller's kill wait (cancel, time limit).
    escalate: bool = False
    # Seconds before SIGKILL when escalating; None: the controller's kill wait. A
    # preempted job gets its QoS grace time.
    grace_s: float | None = None
    # scancel N.S: only the tasks of this step (None: the whole job).
    step_id: int | None = None


@dataclass(frozen=True)
class Emit(Effect):
    seq: int
    kind: str  # submitted, started, running, finished, cancelled, requeued, ...
    at: float
    job: dict[str, Any] = field(default_factory=dict, compare=False)
