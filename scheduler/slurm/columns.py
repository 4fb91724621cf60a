"""The `%[.][width]x` format strings of squeue and sinfo, and their column padding.

A width pads and also cuts (Slurm prints with `%-*.*s`), a `.` right-justifies, and
sinfo's `#` asks for a width that fits the longest value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FIELD_RE = re.compile(r"%(\.)?(#|\d+)?([A-Za-z])")


@dataclass(frozen=True)
class Field:
    key: str
    width: int = 0  # 0: as wide as the value
    right: bool = False
    fit: bool = False  # sinfo's `#`: as wide as the widest value (and the header)
    suffix: str = ""


Piece = str | Field


def parse_percent_format(fmt: str, known: frozenset[str] | set[str]) -> list[Piece]:
    """Split `%.18i %j` into fields and the literal text between them.

    Raises ValueError for a letter the command does not know.
    """
    pieces: list[Piece] = []
    pos = 0
    for match in _FIELD_RE.finditer(fmt):
        if match.start() > pos:
            pieces.append(fmt[pos : match.start()])
        dot, width, key = match.groups()
        if key not in known:
            raise ValueError(f"Invalid format specification: {key}")
        pieces.append(
            Field(
                key=key,
                width=int(width) if width and width != "#" else 0,
                right=dot is not None,
                fit=width == "#",
            )
        )
        pos = match.end()
    if pos < len(fmt):
        pieces.append(fmt[pos:])
    return pieces


def pad(value: str, width: int, right: bool) -> str:
    """Slurm's `_print_str`: pad to width and cut what does not fit."""
    if width <= 0:
        return value
    cut = value[:width]
    return cut.rjust(width) if right else cut.ljust(width)


def render(
    pieces: list[Piece],
    rows: list[dict[str, str]],
    headers: dict[str, str],
    *,
    header: bool,
    fit_minimum: dict[str, int] | None = None,
) -> list[str]:
    """Lay rows (field key -> text) out in the columns `pieces` describe."""
    widths: dict[int, int] = {}
    for index, piece in enumerate(pieces):
        if isinstance(piece, Field) and piece.fit:
            values = [row[piece.key] for row in rows] + [headers[piece.key]]
            minimum = (fit_minimum or {}).get(piece.key, 0)
            widths[index] = max(minimum, *(len(v) for v in values))
    # Each piece once as (key or None for literal text, text, width, right, suffix): the
    # loop below runs for every cell of every row (10,000 jobs make 100,000 cells).
    plan = [
        (None, piece, 0, False, "")
        if isinstance(piece, str)
        else (piece.key, "", widths.get(index, piece.width), piece.right, piece.suffix)
        for index, piece in enumerate(pieces)
    ]
    table = ([headers] if header else []) + rows
    return [
        "".join(
            [
                text
                if key is None
                else (
                    (row[key][:width].rjust(width) if right else row[key][:width].ljust(width))
                    if width > 0
                    else row[key]
                )
                + suffix
                for key, text, width, right, suffix in plan
            ]
        )
        for row in table
    ]
