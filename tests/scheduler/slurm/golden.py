"""Reads the captured Slurm 22.05 output in `../shared/reference/slurm-golden/`, and
keeps the account of which of its cases the tests compare.

The files stay where they are (they are shared reference, not project data); a test that
needs one is skipped where the reference tree is not checked out.

A test that compares our output with a case (a `$ command` block of a file), after
normalising only what differs from run to run (ids, times, names), says so with
`@compares((file, command), ...)`; a test that shows a difference that is meant to stay
(test_golden_coverage.DIFFERENCES says why) says so with `@differs(...)`. Either claim
is checked when the test runs: it must have read each case it names through `capture`,
or it fails. tests/scheduler/slurm/test_golden_coverage.py then requires every case of
every file to be compared or a listed difference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

GOLDEN_DIR = Path(__file__).resolve().parents[3] / ".." / "shared" / "reference" / "slurm-golden"


@dataclass(frozen=True)
class Capture:
    command: str
    stdout: str
    stderr: str
    exit_code: int


def captures(name: str) -> list[Capture]:
    path = GOLDEN_DIR / name
    if not path.exists():
        pytest.skip(f"golden file {name} is not available")
    found: list[Capture] = []
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        command = lines[i][2:]
        assert lines[i + 1] == "----- stdout -----"
        i += 2
        out: list[str] = []
        while lines[i] != "----- stderr -----":
            out.append(lines[i])
            i += 1
        i += 1
        err: list[str] = []
        while not lines[i].startswith("----- exit code: "):
            err.append(lines[i])
            i += 1
        code = int(lines[i].removeprefix("----- exit code: "))
        found.append(Capture(command, _text(out), _text(err), code))
        i += 1
    return found


def capture(name: str, command: str) -> Capture:
    for item in captures(name):
        if item.command == command:
            _read.add((name, command))
            return item
    raise AssertionError(f"no `{command}` in {name}")


Case = tuple[str, str]  # (file, command)
F = TypeVar("F", bound=Callable[..., Any])
# Who claims what: case -> the tests (module.name) that compare it, or show it differ.
COMPARED: dict[Case, list[str]] = {}
DIFFERING: dict[Case, list[str]] = {}
_read: set[Case] = set()  # the cases the running test has read


def compares(*cases: Case) -> Callable[[F], F]:
    """This test compares our output with each of `cases`, equal after normalising."""
    return _claim(COMPARED, cases)


def differs(*cases: Case) -> Callable[[F], F]:
    """This test shows how our output differs from each of `cases`, and fails if it
    stops differing so (test_golden_coverage.DIFFERENCES gives the reason)."""
    return _claim(DIFFERING, cases)


def _claim(table: dict[Case, list[str]], cases: tuple[Case, ...]) -> Callable[[F], F]:
    def mark(test: F) -> F:
        for case in cases:
            table.setdefault(case, []).append(f"{test.__module__}.{test.__name__}")
        # A parametrised test reads one case a call; the others are read by the others.
        each = any(m.name == "parametrize" for m in getattr(test, "pytestmark", []))

        @functools.wraps(test)
        def checked(*args: Any, **kwargs: Any) -> Any:
            _read.clear()
            result = test(*args, **kwargs)
            unread = [c for c in cases if c not in _read]
            if each:
                assert len(unread) < len(cases), f"{test.__name__} read none of {cases}"
            else:
                assert not unread, f"{test.__name__} claims {unread} but never read them"
            return result

        return checked  # type: ignore[return-value]

    return mark


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)
