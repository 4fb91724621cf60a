"""What each command costs to start: its installed console script, run whole against a
web API on loopback, imports none of the heavy libraries (httpx, tenacity, Django, ...)
nor the modules of the other commands. `python -X importtime` names every module a
process imports, the script's own entry-point wrapper included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scheduler.cli.fake_api import FakeApi

BIN = Path(sys.executable).parent
HEAVY = (
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "tenacity",
    "pydantic",
    "django",
    "rest_framework",
    "starlette",
    "rich",
    "click",
    "importlib.metadata",
    "asyncio",
)
RUNS = [
    ("sbatch", ["--wrap", "true"]),
    ("squeue", []),
    ("squeue", ["-u", "root", "-t", "PD", "-O", "JobID,StdOut"]),
    ("sacct", []),
    ("scancel", ["100"]),
    ("sinfo", []),
    ("spur", ["squeue"]),
    ("spur", ["output", "100"]),
    ("sbatch", ["--help"]),
]


def imported(argv: list[str]) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=60,
        check=False,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return modules, done


@pytest.mark.parametrize(("command", "args"), RUNS, ids=[" ".join([c, *a]) for c, a in RUNS])
def test_a_command_imports_nothing_heavy(fake_api: FakeApi, command: str, args: list[str]) -> None:
    fake_api.jobs[100] = {"job_id": 100, "state": "PENDING"}
    script = BIN / command
    assert script.exists(), f"{script}: run `pip install -e .`"
    modules, done = imported([str(script), *args])
    assert "scheduler.cli.console" in modules, done.stderr[-2000:]
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)
    assert heavy == [], f"{command} {' '.join(args)} imports {heavy}"
    others = {"sbatch", "squeue", "sacct", "scancel", "sinfo", "output"} - {command, *args[:1]}
    assert not {f"scheduler.cli.{o}" for o in others} & modules
    if "--help" not in args:
        assert fake_api.requests, done.stderr[-2000:]  # it did reach the server


def test_the_cheap_modules_stay_cheap() -> None:
    """What every command and every service imports for its errors costs nothing."""
    modules, done = imported(["-c", "import scheduler.rpc.errors, scheduler.cli.api"])
    assert done.returncode == 0, done.stderr[-2000:]
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or m == "http.client")
    assert heavy == []
