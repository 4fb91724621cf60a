"""Reads the captured Slurm 22.05 output in `../shared/reference/slurm-golden/`.

The files stay where they are (they are shared reference, not project data); a test that
needs one is skipped where the reference tree is not checked out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
            return item
    raise AssertionError(f"no `{command}` in {name}")


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)
