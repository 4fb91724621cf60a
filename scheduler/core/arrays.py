"""Job arrays: Slurm's `--array` expressions, and the compact form squeue prints.

`0-15%4` (throttle: at most 4 tasks run at once), `0,6,16-32`, `0-15:4` (step).
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.errors import Rejected

MAX_ARRAY_SIZE = 1001  # Slurm's MaxArraySize default: task ids 0..1000
BAD_ARRAY = "Invalid job array specification"


def parse_array(expr: str) -> tuple[tuple[int, ...], int]:
    """Task ids (sorted, unique) and the throttle (0: none) of an `--array` value."""
    text = expr.strip()
    throttle = 0
    if "%" in text:
        text, _, limit = text.partition("%")
        if not limit.isdigit() or int(limit) < 1:
            raise Rejected(f"{BAD_ARRAY}: bad throttle in {expr!r}", code="invalid_array")
        throttle = int(limit)
    ranges = [_range(part, expr) for part in text.split(",")]
    # Bounded before anything is expanded: `0-100000000` must cost nothing.
    if any(r and r[-1] >= MAX_ARRAY_SIZE for r in ranges):
        raise Rejected(
            f"{BAD_ARRAY}: task ids must be below {MAX_ARRAY_SIZE} in {expr!r}",
            code="invalid_array",
        )
    ids = {i for r in ranges for i in r}
    if not ids:
        raise Rejected(f"{BAD_ARRAY}: {expr!r} names no tasks", code="invalid_array")
    return tuple(sorted(ids)), throttle


def _range(part: str, expr: str) -> range:
    bounds, _, step_text = part.partition(":")
    first, dash, last = bounds.partition("-")
    try:
        lo = _nonneg(first)
        hi = _nonneg(last) if dash else lo
        step = _nonneg(step_text) if step_text else 1
    except ValueError:
        raise Rejected(f"{BAD_ARRAY}: {expr!r}", code="invalid_array") from None
    if hi < lo or step < 1 or (step_text and not dash):
        raise Rejected(f"{BAD_ARRAY}: {expr!r}", code="invalid_array")
    return range(lo, hi + 1, step)


def _nonneg(text: str) -> int:
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def compress(ids: Iterable[int]) -> str:
    """`[0, 1, 2, 5, 7, 8]` -> `0-2,5,7-8`, as squeue prints the pending tasks."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(_run(run))
        run = [i]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


__all__ = ["MAX_ARRAY_SIZE", "compress", "parse_array"]
