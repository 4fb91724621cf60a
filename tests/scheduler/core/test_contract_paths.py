"""Where a job's files may lie: the text-only check the submit edge runs."""

from __future__ import annotations

import pytest

from scheduler.core.contract import JobSpec, outside_workspace

WS = "/srv/work/acme"


def refused(**fields: str) -> tuple[str, str] | None:
    return outside_workspace(JobSpec(script="#!/bin/sh\n", **fields), WS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"workdir": "data"},
        {"workdir": f"{WS}/runs/1"},
        {"workdir": WS},
        {"workdir": "a/../b"},
        {"stdout": "out/%x-%j.log", "stderr": "err-%j", "stdin": "input.txt"},
        {"stdout": f"{WS}/logs/%j.out"},
        {"stdout": "/dev/null", "stderr": "/dev/null", "stdin": "/dev/null"},
        # sbatch ran outside the workspace: the job gets a directory of its own there,
        # and a relative pattern may climb back to the workspace itself.
        {"submit_dir": "/home/alice", "stdout": "../../out.log"},
        {"submit_dir": f"{WS}/proj/a", "stdout": "../../x.out"},
    ],
)
def test_paths_inside_the_workspace_pass(fields: dict[str, str]) -> None:
    assert refused(**fields) is None


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"workdir": "/root"}, "workdir"),
        ({"workdir": "/srv/work/acme-evil"}, "workdir"),  # a sibling sharing a prefix
        ({"workdir": "../globex"}, "workdir"),
        ({"workdir": "/srv/work"}, "workdir"),
        ({"stdout": "/etc/x"}, "stdout"),
        ({"stderr": "/srv/work/globex/slurm-1.out"}, "stderr"),
        ({"stdin": "/var/lib/spur/cluster-token"}, "stdin"),
        ({"stdout": "../../../etc/passwd"}, "stdout"),
        ({"workdir": "a", "stdout": "../../x"}, "stdout"),
        ({"submit_dir": f"{WS}/p", "stdout": "../../x"}, "stdout"),
        ({"submit_dir": "/home/alice", "stdout": "../../../x"}, "stdout"),
    ],
)
def test_paths_that_leave_the_workspace_are_named(fields: dict[str, str], field: str) -> None:
    outcome = refused(**fields)
    assert outcome is not None
    assert outcome[0] == field
    assert "outside your organisation's workspace /srv/work/acme" in outcome[1]
