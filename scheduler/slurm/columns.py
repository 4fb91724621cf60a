"""The `%[.][width]x` format strings of squeue and sinfo, and their column padding.

A width pads and also cuts (Slurm prints with `%-*.*s`), a `.` right-justifies, and
sinfo's `#` asks for a width that fits the longest value.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

# A field is `%(\.)?(#|\d+)?([A-Za-z])`, read by hand (`parse_percent_format`): squeue
# reads its default format at every start, and `re` (with the `enum` it imports) would
# cost about half the interpreter's own start (tests/scheduler/cli/test_startup.py).
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class Field:
    """One column of a format: its key, width (0: as wide as the value), `right`
    justified, sinfo's `#` (`fit`: as wide as the widest value and the header), and the
    text after it (`-O Name:20suffix`). A plain class, not a dataclass: squeue builds its
    format at start-up, and `dataclasses` costs a third of the interpreter's start."""

    __slots__ = ("fit", "key", "right", "suffix", "width")

    def __init__(
        self, key: str, width: int = 0, right: bool = False, fit: bool = False, suffix: str = ""
    ) -> None:
        self.key, self.width, self.right, self.fit, self.suffix = key, width, right, fit, suffix

    def _values(self) -> tuple[str, int, bool, bool, str]:
        return (self.key, self.width, self.right, self.fit, self.suffix)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "Field({!r}, {!r}, {!r}, {!r}, {!r})".format(*self._values())


Piece = str | Field


def parse_percent_format(fmt: str, known: frozenset[str] | set[str]) -> list[Piece]:
    """Split `%.18i %j` into fields and the literal text between them.

    Raises ValueError for a letter the command does not know.
    """
    pieces: list[Piece] = []
    pos = 0  # where the text not yet in a piece starts
    start = fmt.find("%")
    while start >= 0:
        # The pattern's one reading: each part takes all it can, and a `%` that does not
        # start a field is text.
        end = start + 1  # after the `%` and its `.`, if it has one
        right = fmt.startswith(".", end)
        if right:
            end += 1
        fit = fmt.startswith("#", end)
        digits = end + 1 if fit else end  # after the width
        while not fit and digits < len(fmt) and fmt[digits].isdecimal():  # `\d`'s digits
            digits += 1
        key = fmt[digits : digits + 1]
        if key not in _LETTERS:
            start = fmt.find("%", start + 1)
            continue
        if key not in known:
            raise ValueError(f"Invalid format specification: {key}")
        if start > pos:
            pieces.append(fmt[pos:start])
        width = int(fmt[end:digits]) if digits > end and not fit else 0
        pieces.append(Field(key=key, width=width, right=right, fit=fit))
        pos = digits + 1
        start = fmt.find("%", pos)
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


# -- a column at a time (squeue's and sacct's long lists) ----------------------------------


def padder(width: int, right: bool, suffix: str = "") -> Callable[[str], str]:
    """`pad` as a function of the value, with the text after the column."""
    if width <= 0:
        return (lambda value: value + suffix) if suffix else str
    escaped = suffix.replace("{", "{{").replace("}", "}}")
    return f"{{:{'>' if right else '<'}{width}.{width}}}{escaped}".format


def _distinct(column: Sequence[Any]) -> tuple[Sequence[Any], dict[Any, None]] | None:
    """A column's values as memo keys (lists, a job's nodes, as tuples) and the distinct
    ones; None when it holds objects (allocations, steps), which no memo can key."""
    try:
        return column, dict.fromkeys(column)
    except TypeError:
        pass
    converted = [tuple(v) if type(v) is list else v for v in column]
    try:
        return converted, dict.fromkeys(converted)
    except TypeError:
        return None


def distinct_of(column: Sequence[Any], seen: dict[int, Any]) -> Any:
    """`_distinct(column)`, kept in `seen` by the column's id (see `texts`)."""
    key = id(column)
    if key not in seen:
        seen[key] = (column, _distinct(column))  # the column held: its id stays its own
    return seen[key][1]


def seen_one(column: Sequence[Any], seen: dict[int, Any]) -> None:
    """Records in `seen` that `column` holds one hashable value throughout (its maker
    knows, at no cost): `distinct_of` then finds nothing to count."""
    seen[id(column)] = (column, (column, {column[0]: None}))


def _pick(column: Sequence[Any], rows: Sequence[int]) -> Sequence[Any]:
    """`column`'s values at `rows`, in their order: the column itself for all of them in
    order, and the picking done in C otherwise (`itemgetter`)."""
    if isinstance(rows, range) and rows == range(len(column)):
        return column
    if len(rows) < 2:
        return [column[i] for i in rows]
    if column.count(column[0]) == len(column):  # one value throughout: nothing to pick
        return [column[0]] * len(rows)
    return itemgetter(*rows)(column)  # type: ignore[no-any-return]


def texts(
    value: Callable[..., str],
    sources: Sequence[Sequence[Any]],
    rows: Sequence[int],
    *head: Any,
    seen: dict[int, Any] | None = None,
) -> list[str]:
    """`value(*head, *values)` for each of `rows`, its values taken from `sources` (a
    column per field `value` reads), computed once per distinct values: a column of a
    long list holds few (one state, one reason, one time for 10,000 pending jobs). A
    source that holds one value throughout is read once; a column of distinct values
    (the job ids) is computed row by row, with no memo to fill.

    `seen` keeps each source's distinct values (`distinct_of`) between the calls of one
    table's columns, by the source's id: the sources must outlive it (sacct reads the
    rows' steps in every column)."""
    if not sources:
        return [value(*head)] * len(rows)
    picked = [_pick(src, rows) for src in sources]
    if seen is None:
        found = [_distinct(column) for column in picked]
    else:
        found = [distinct_of(column, seen) for column in picked]
    keyed = [k for k in found if k is not None]
    if len(keyed) < len(found):
        return [value(*head, *values) for values in zip(*picked, strict=True)]
    hashable = [column for column, _ in keyed]
    distinct = [d for _, d in keyed]
    args = [*head, *(next(iter(d), None) for d in distinct)]
    varying = [j for j, d in enumerate(distinct) if len(d) > 1]
    if not varying:
        return [value(*args)] * len(rows)
    if len(varying) == 1:
        (j,) = varying
        at = len(head) + j
        keys: Sequence[Any] = hashable[j]
        unique = distinct[j]
        if len(unique) * 2 > len(keys):  # mostly distinct (the job ids): no memo, and
            # the calls made by map in C, the other arguments repeated
            return list(map(value, *(keys if k == at else repeat(a) for k, a in enumerate(args))))

        def call(key: Any) -> str:
            args[at] = key
            return value(*args)

    else:
        keys = list(zip(*(hashable[j] for j in varying), strict=True))
        unique = dict.fromkeys(keys)
        places = [len(head) + j for j in varying]

        def call(key: Any) -> str:
            for at, item in zip(places, key, strict=True):
                args[at] = item
            return value(*args)

    if len(unique) * 2 > len(keys):
        return list(map(call, keys))  # mostly distinct: a memo would only cost
    memo = {key: call(key) for key in unique}
    return list(map(memo.__getitem__, keys))


def render_columns(
    columns: Sequence[Sequence[str] | str], headers: Sequence[str] | None, count: int
) -> list[str]:
    """Lines of `count` rows from each column's cells (already padded), a plain string
    being text between the columns; `headers` (one per column) the first line."""
    parts = [repeat(c, count) if isinstance(c, str) else c for c in columns]
    lines = [] if headers is None else ["".join(headers)]
    if count:
        # The literal parts repeat without end; the columns have `count` cells each.
        lines.extend(map("".join, zip(*parts, strict=False)) if parts else [""] * count)
    return lines
