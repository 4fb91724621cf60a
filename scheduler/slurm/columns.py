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
    # One format string for a whole line: `{0:<8.8}` pads and cuts as Slurm's `%-8.8s`
    # does, in C, so a line costs one `format` call (10,000 jobs make 100,000 cells).
    keys: list[str] = []
    template = []
    for index, piece in enumerate(pieces):
        if isinstance(piece, str):
            template.append(piece.replace("{", "{{").replace("}", "}}"))
            continue
        width = widths.get(index, piece.width)
        spec = f":{'>' if piece.right else '<'}{width}.{width}" if width > 0 else ""
        template.append(
            f"{{{len(keys)}{spec}}}" + piece.suffix.replace("{", "{{").replace("}", "}}")
        )
        keys.append(piece.key)
    line = "".join(template).format
    table = ([headers] if header else []) + rows
    return [line(*[row[key] for key in keys]) for row in table]
