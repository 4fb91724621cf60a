"""Job steps: what `srun` runs inside an allocation, defined once.

A step is a set of tasks (ranks) on some of its job's nodes. The controller records it
(`CreateStep`, `StepFinished`, `CancelStep` in scheduler/core/commands.py); the job
object carries its steps (`steps`, in `JOB_FIELDS`), so the history, `sacct` and the
web API read the same rows. `N.batch` (the batch script) is not a step of this table:
sacct derives it from the job itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

# Bounds of a step request, checked at the controller's edge before anything is
# proposed to Raft (and again by the core).
MAX_STEPS_PER_JOB = 10_000
MAX_STEP_TASKS = 4096
MAX_STEP_ARGS = 4096
MAX_STEP_ARGV_BYTES = 1024 * 1024
MAX_STEP_ENV = 4096
MAX_STEP_ENV_BYTES = 4 * 1024 * 1024
MAX_STEP_NAME = 200
# srun's side of a running step: its -i modes (or a task's rank), --pty's window, and one
# piece of its input as the agent, the web and srun carry it.
STEP_INPUT_MODES = ("all", "none")
MAX_PTY_SIZE = 1000  # columns or rows of a terminal: no screen has more
MAX_STEP_INPUT_CHUNK = 256 * 1024


class StepState(StrEnum):
    """A step's states, with sacct's words: a step runs, then ends one of three ways."""

    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self is not StepState.RUNNING


@dataclass(frozen=True)
class Step:
    step_id: int
    name: str
    nodes: tuple[str, ...]
    ntasks: int
    cpus: int  # CPUs of the allocation on its nodes (sacct's AllocCPUS)
    start_time: float
    state: StepState = StepState.RUNNING
    end_time: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    cmd_id: str = ""  # the CreateStep that made it (finds it again after the commit)

    def ended(self, state: StepState, now: float, exit_code: int, signal: int) -> Step:
        return replace(self, state=state, end_time=now, exit_code=exit_code, signal=signal)

    def to_dict(self) -> dict[str, Any]:
        """One entry of the job object's `steps` (STEP_KEYS)."""
        return {
            "step_id": self.step_id,
            "name": self.name,
            "nodes": list(self.nodes),
            "ntasks": self.ntasks,
            "cpus": self.cpus,
            "state": self.state.value,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "exit_code": self.exit_code,
            "signal": self.signal,
        }


STEP_KEYS = (
    "step_id",
    "name",
    "nodes",
    "ntasks",
    "cpus",
    "state",
    "start_time",
    "end_time",
    "exit_code",
    "signal",
)


def step_state_of(exit_code: int, signal: int, *, cancelled: bool = False) -> StepState:
    """How a step ended, from its tasks' worst status."""
    if cancelled:
        return StepState.CANCELLED
    return StepState.COMPLETED if (exit_code, signal) == (0, 0) else StepState.FAILED
