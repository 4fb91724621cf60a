"""The `%[.][width]x` formats (scheduler/slurm/columns.py) are read by hand, without `re`
(squeue reads its default format at every start): they split exactly as the pattern
`%(\\.)?(#|\\d+)?([A-Za-z])` splits them, found left to right, the text between kept."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.slurm.columns import Field, Piece, parse_percent_format

FIELD_RE = re.compile(r"%(\.)?(#|\d+)?([A-Za-z])")


def by_the_pattern(fmt: str, known: set[str]) -> list[Piece]:
    pieces: list[Piece] = []
    pos = 0
    for match in FIELD_RE.finditer(fmt):
        if match.start() > pos:
            pieces.append(fmt[pos : match.start()])
        dot, width, key = match.groups()
        if key not in known:
            raise ValueError(f"Invalid format specification: {key}")
        fit = width == "#"
        pieces.append(Field(key, int(width) if width and not fit else 0, dot is not None, fit))
        pos = match.end()
    if pos < len(fmt):
        pieces.append(fmt[pos:])
    return pieces


KNOWN = set("ijPTMDRlt")
# The characters that mean something to the pattern, the ones around them, a digit that
# is not ASCII (`\d` takes it, and int() reads it), and a letter that is not ASCII.
FORMATS = st.text(alphabet=st.sampled_from("%.#0123456789٣ijPTzZé -|:"), max_size=24)


@given(FORMATS)
def test_a_format_splits_as_the_pattern_splits_it(fmt: str) -> None:
    try:
        expected: list[Piece] | str = by_the_pattern(fmt, KNOWN)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: list[Piece] | str = parse_percent_format(fmt, KNOWN)
    except ValueError as exc:
        got = str(exc)
    assert got == expected


@pytest.mark.parametrize(
    ("fmt", "pieces"),
    [
        ("%.18i %j", [Field("i", 18, True), " ", Field("j")]),
        ("%#P|%%i%", [Field("P", fit=True), "|%", Field("i"), "%"]),
        ("%.%5T.", ["%.", Field("T", 5), "."]),
        ("%-5i%", ["%-5i%"]),
    ],
)
def test_what_a_format_is_made_of(fmt: str, pieces: list[Piece]) -> None:
    assert parse_percent_format(fmt, KNOWN | {"j"}) == pieces
