"""Output file patterns (`--output`, `--error`, `--input`): `slurm-%j.out` and friends.

Mirrors Slurm's `fname_create`: `%%`, `%A`, `%a`, `%J`, `%j`, `%N`, `%n`, `%s`, `%t`,
`%u`, `%x`, a zero-padding width (`%4j`, at most 10 as in Slurm), and no substitution
at all once the pattern holds a backslash (the backslashes are dropped).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from typing import Any

DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"

# Slurm prints its NO_VAL for %a outside an array, and scripts have come to expect it.
NO_VAL = 4294967294
_MAX_WIDTH = 10


def expand_output(
    pattern: str,
    *,
    job_id: int,
    name: str,
    user: str,
    node: str = "",
    array_job_id: int | None = None,
    array_task_id: int | None = None,
    step: int | None = None,
    task: int | None = None,
    nodeid: int = 0,
) -> str:
    """Expand a Slurm file name pattern. `step=None` is the batch step."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    out: list[str] = []
    i = 0
    n = len(pattern)
    while i < n:
        char = pattern[i]
        if char != "%" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        j = i + 1
        while j < n and pattern[j].isdigit():
            j += 1
        width = min(int(pattern[i + 1 : j]), _MAX_WIDTH) if j > i + 1 else 0
        if j >= n:
            out.append(pattern[i:])
            break
        key = pattern[j]
        number: int | None = None
        text: str | None = None
        if key == "%":
            text = "%"
        elif key == "j":
            number = job_id
        elif key == "J":
            text = f"{job_id:0{width}d}" + (f".{step}" if step is not None else "")
        elif key == "A":
            number = array_job_id if array_job_id is not None else job_id
        elif key == "a":
            number = array_task_id if array_task_id is not None else NO_VAL
        elif key == "s":
            if step is None:
                text = "batch"
            else:
                number = step
        elif key == "t":
            number = task if task is not None else 0
        elif key == "n":
            number = nodeid
        elif key == "N":
            text = node.split(".", 1)[0]
        elif key == "u":
            text = user
        elif key == "x":
            text = name
        else:
            # An unknown letter stays as written, width included.
            text = pattern[i : j + 1]
        out.append(text if text is not None else f"{number:0{width}d}")
        i = j + 1
    return "".join(out)


def default_output(spec: Any = None, *, array: bool = False) -> str:
    """The pattern Slurm writes a job's output to when no `--output` was given."""
    spec_array: object = getattr(spec, "array", None)
    if array or spec_array:
        return DEFAULT_ARRAY_OUTPUT
    return DEFAULT_OUTPUT


def resolve(path: str, workdir: str) -> str:
    """Relative patterns are relative to the job's working directory (`--chdir`)."""
    if not path or os.path.isabs(path):
        return path
    return os.path.join(workdir, path)
