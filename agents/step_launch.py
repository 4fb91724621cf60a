"""What a step launch asks of this node (agents/steps.py), read and checked field by
field (its signature was checked before: this is the shape, which the controller could
still get wrong), and the stdio each task is started with (agents/step_io.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.launch_request import InvalidLaunch
from agents.step_io import input_fifo, output_fifo
from scheduler.core.contract.steps import MAX_PTY_SIZE, STEP_INPUT_MODES

JOURNALS = {"stdout": "out", "stderr": "err"}  # a FIFO's journal (agents/step_io.py)


class TaskStreams:
    """One task's stdio (agents/step_io.py): the ends it gets, those its supervisor
    holds, and the agent's read ends of its output FIFOs."""

    def __init__(self, taskdir: Path, *, quiet: bool, reads_input: bool) -> None:
        self.stdio: tuple[int, int, int]
        self.hold: list[int] = []
        self.input_writer = -1  # the stdin FIFO's writer, for its holder (agents/step_io.py)
        self.errors: int | None = None
        self.fifos: list[tuple[str, int, str]] = []  # (key, the agent's read end, name)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self._theirs = [null]
        if quiet:
            self.stdio = (null, null, null)
            return
        out, out_task, out_held = output_fifo(taskdir / "stdout")
        self.fifos.append(("o", out, "stdout"))
        err, err_task, err_held = output_fifo(taskdir / "stderr")
        self.fifos.append(("e", err, "stderr"))
        self.errors = err
        self._theirs += [out_task, out_held, err_task, err_held]
        self.hold = [out_held, err_held]
        stdin = null
        if reads_input:
            stdin, self.input_writer = input_fifo(taskdir / "stdin")
            self._theirs += [stdin, self.input_writer]
        self.stdio = (stdin, out_task, err_task)

    def close_theirs(self) -> None:
        for fd in self._theirs:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._theirs = []

    def close_ours(self) -> None:
        for _, fd, _ in self.fifos:
            with contextlib.suppress(OSError):
                os.close(fd)


def task_cpus(
    job_cpus: frozenset[int], step: Mapping[str, Any], local: int, tasks_here: int
) -> frozenset[int]:
    """The CPUs a task is bound to: the job's on this node, or with --cpu-bind=cores its
    own share of them (cpus-per-task each, in order), when the job's CPUs are known and
    enough; otherwise the job's, which is all the allocation allows."""
    if step.get("cpu_bind") != "cores" or not job_cpus:
        return job_cpus
    ordered = sorted(job_cpus)
    per = max(int(step.get("cpus_per_task") or 1), 1)
    if tasks_here * per > len(ordered):
        return job_cpus
    return frozenset(ordered[local * per : (local + 1) * per])


def input_ranks(step: Mapping[str, Any], ranks: list[int], *, pty: bool) -> frozenset[int]:
    """The tasks here that read srun's input: all of them (`--input=all`, Slurm's
    default), one (`-i N`), none (`-i none`); with --pty, task 0 alone."""
    mode = step.get("input", "all")
    if pty:
        return frozenset({0}) & frozenset(ranks)
    if mode in STEP_INPUT_MODES:
        return frozenset(ranks) if mode == "all" else frozenset()
    if isinstance(mode, int) and not isinstance(mode, bool) and mode >= 0:
        return frozenset({mode}) & frozenset(ranks)
    raise InvalidLaunch('step.input must be "all", "none" or a task rank')


def pty_size(step: Mapping[str, Any]) -> tuple[int, int] | None:
    size = step.get("pty")
    if size is None:
        return None
    if (
        not isinstance(size, list)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in size)
        or not all(0 <= v <= MAX_PTY_SIZE for v in size)
    ):
        raise InvalidLaunch("step.pty must be [columns, rows]")
    return int(size[0]), int(size[1])


def integer(payload: Mapping[str, Any], key: str) -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidLaunch(f"{key} must be a non-negative integer")
    return value


def strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidLaunch(f"{what} must be a list of strings")
    return list(value)


def task_entry(entry: Any) -> tuple[int, int, list[int]]:
    if (
        not isinstance(entry, list)
        or len(entry) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry[:2])
        or not isinstance(entry[2], list)
        or not all(isinstance(g, int) for g in entry[2])
    ):
        raise InvalidLaunch("each task is [rank, local id, [gpus]]")
    return int(entry[0]), int(entry[1]), [int(g) for g in entry[2]]


__all__ = [
    "JOURNALS",
    "TaskStreams",
    "input_ranks",
    "integer",
    "pty_size",
    "strings",
    "task_cpus",
    "task_entry",
]
