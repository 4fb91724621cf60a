"""The admin commands start as cheaply as the others (tests/scheduler/cli/test_startup.py
says why and how): their installed console scripts, run against a web API on loopback,
import nothing heavy and none of the other commands' modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.cli.test_startup import HEAVY, imported

BIN = Path(sys.executable).parent
RUNS = [
    ("scontrol", ["show", "node"]),
    ("scontrol", ["show", "partition"]),
    ("scontrol", ["show", "hostnames", "gpu[01-03]"]),
    ("scontrol", ["hold", "100"]),
    ("sprio", []),
    ("sshare", ["-a"]),
    ("sacctmgr", ["show", "assoc"]),
    ("sinfo", ["-O", "Partition,Nodes"]),
]
COMMANDS = {"sbatch", "squeue", "sacct", "scancel", "sinfo", "scontrol", "sprio", "sshare",
            "sacctmgr"}  # fmt: skip


@pytest.mark.parametrize(("command", "args"), RUNS, ids=[" ".join([c, *a]) for c, a in RUNS])
def test_an_admin_command_imports_nothing_heavy(
    fake_api: FakeApi, command: str, args: list[str]
) -> None:
    script = BIN / command
    assert script.exists(), f"{script}: run `pip install -e .`"
    modules, done = imported([str(script), *args])
    assert "scheduler.cli.console" in modules, done.stderr[-2000:]
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)
    assert heavy == [], f"{command} {' '.join(args)} imports {heavy}"
    assert not {f"scheduler.cli.{o}" for o in COMMANDS - {command}} & modules
    if "hostnames" in args:
        assert done.stdout == "gpu01\ngpu02\ngpu03\n" and not fake_api.requests
    else:
        assert fake_api.requests, done.stderr[-2000:]  # it did reach the server
