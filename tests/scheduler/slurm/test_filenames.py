"""Output file patterns (`--output=%x-%j.out`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scheduler.slurm.filenames import default_output, expand_output, resolve


def expand(pattern: str, **kw: Any) -> str:
    args: dict[str, Any] = {"job_id": 42, "name": "train", "user": "alice", "node": "gpu01"}
    args.update(kw)
    return expand_output(pattern, **args)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("slurm-%j.out", "slurm-42.out"),
        ("%x-%u.log", "train-alice.log"),
        ("%N-%n-%t.out", "gpu01-0-0.out"),
        ("%4j", "0042"),
        ("%%j", "%j"),
        ("100%", "100%"),
        ("%J", "42"),
        ("%s", "batch"),
        ("%A_%a", "42_4294967294"),  # Slurm's NO_VAL outside an array
        ("%q", "%q"),
        ("%12j", "0000000042"),  # Slurm caps the width at 10
    ],
)
def test_it_substitutes_slurms_patterns(pattern: str, expected: str) -> None:
    assert expand(pattern) == expected


def test_steps_tasks_and_arrays_fill_their_fields() -> None:
    out = expand("%A_%3a-%J-%s-%t-%n", array_job_id=40, array_task_id=7, step=0, task=3, nodeid=1)
    assert out == "40_007-42.0-0-3-1"


def test_a_backslash_turns_substitution_off() -> None:
    assert expand("out\\%j.txt") == "out%j.txt"


def test_node_names_are_short() -> None:
    assert expand("%N", node="gpu01.cluster.local") == "gpu01"


def test_defaults_depend_on_arrays() -> None:
    assert default_output() == "slurm-%j.out"
    assert default_output(SimpleNamespace(array="0-3")) == "slurm-%A_%a.out"
    assert default_output(array=True) == "slurm-%A_%a.out"


def test_relative_paths_resolve_against_the_working_directory() -> None:
    assert resolve("out/x.log", "/home/alice") == "/home/alice/out/x.log"
    assert resolve("/dev/null", "/home/alice") == "/dev/null"
    assert resolve("", "/w") == ""
