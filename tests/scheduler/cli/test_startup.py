"""What each command costs to start: its installed console script, run whole against a
web API on loopback, imports none of the heavy libraries (httpx, tenacity, Django, ...)
nor the modules of the other commands; `sbatch --wrap true` imports nothing but what
ALLOWED names beyond what the interpreter itself loads (`python -c pass`, the floor
bench/cli.py divides by). `python -X importtime` names every module a process imports,
the script's own entry-point wrapper included."""

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
# What the standard library could give at start-up that costs a large part of the
# interpreter's own start, for nothing the commands need there: `json`, `urllib` and
# `pathlib` (they import `re`, and `re` imports `enum`: scheduler/cli/wire.py says what
# the commands use instead), `typing` (type hints are for the checker: TYPE_CHECKING),
# `dataclasses` (and the `inspect`, `ast`, `dis` and `tokenize` it imports), `socket`
# (its enums, `selectors`, `array`: the CLI talks through `_socket`), and the IDNA codec
# a str host name would load. And `enum`, with the `functools` and `collections` it
# imports, and `re`, which imports it: the contract's states are built without it
# (scheduler/core/contract/strenum.py), squeue's formats are read without a pattern
# (scheduler/slurm/columns.py), and a pattern is compiled only where a command line needs
# one (scheduler/slurm/lazyre.py), so that sbatch, squeue, sacct and scancel start without
# them.
SLOW_AT_START = (
    "json",
    "urllib",
    "pathlib",
    "typing",
    "dataclasses",
    "inspect",
    "ast",
    "tokenize",
    "socket",
    "selectors",
    "encodings.idna",
    "http.client",
    "email",
    "enum",
    "functools",
    "collections",
    "re",
)
# Everything `sbatch --wrap true` may import beyond the interpreter's floor: its own few
# modules, the HTTP client's, and `_json` (the C codec under `json`, without the package:
# it imports `re`, which imports `enum`). A new import on that path (the contract, a
# date, a hostlist, a pattern) has to be lazy, or named here with the reason it is worth
# its cost. `__future__` is the one-line module `from __future__ import annotations`
# loads.
ALLOWED = {
    "__future__",
    "scheduler.cli.wire",
    "scheduler",
    "scheduler.cli",
    "scheduler.cli.sbatch",
    "scheduler.cli.console",
    "scheduler.cli.config",
    "scheduler.cli.api",
    "scheduler.rpc.http",
    "scheduler.rpc",
    "scheduler.rpc.errors",
    "scheduler.slurm",
    "scheduler.slurm.cmdline",
    "scheduler.slurm.batchscript",
    "scheduler.slurm.memfmt",
    "scheduler.slurm.sbatch_options",
    "scheduler.slurm.sbatch_table",  # sbatch_options' table of options, split off as data
    "_socket",
    "_json",
    "gc",  # built in: the console script sets the collector's threshold (console.py)
}
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
    slow = sorted(m for m in modules if m in SLOW_AT_START or m.split(".")[0] in SLOW_AT_START)
    if command in ("sbatch", "squeue", "sacct", "scancel"):  # bench/cli.py times the first 3
        assert slow == [], f"{command} {' '.join(args)} imports {slow}"
    if command in ("sbatch", "sacct"):  # sacct reads its default window with `time`
        assert "datetime" not in modules, f"{command} {' '.join(args)} imports datetime"
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


def test_sbatch_imports_only_what_it_is_allowed_beyond_the_interpreter(
    fake_api: FakeApi, tmp_path: Path
) -> None:
    floor, done = imported(["-c", "pass"])
    assert done.returncode == 0, done.stderr[-2000:]
    modules, done = imported([str(BIN / "sbatch"), "--wrap", "true"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert fake_api.requests and fake_api.requests[0][:2] == ("POST", "/api/v1/jobs")
    assert sorted(modules - floor - ALLOWED) == []


def test_the_contract_package_loads_a_part_only_when_a_name_of_it_is_used() -> None:
    import scheduler.core.contract as contract

    modules, done = imported(["-c", "from scheduler.core.contract import JobState"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "scheduler.core.contract.states" in modules
    assert not {"scheduler.core.contract.spec", "dataclasses", "enum"} & modules
    assert set(contract.__all__) == set(contract._WHERE)  # every name has its part
    for name in contract.__all__:
        assert getattr(contract, name) is not None
