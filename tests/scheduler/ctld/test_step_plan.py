"""What a step request asks for, checked against its job at the controller's edge
(scheduler/ctld/steps.py `plan_step`): who reads srun's input, and task 0's terminal."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.ctld.steps import plan_step
from scheduler.rpc.errors import Refused

JOB: dict[str, Any] = {
    "job_id": 7,
    "nodes": ["sim01", "sim02"],
    "allocation": {"sim01": {"cpus": 4, "gpus": []}, "sim02": {"cpus": 4, "gpus": []}},
    "spec": {"ntasks": 1},
    "workdir": "/w",
}


def plan(**body: Any) -> dict[str, Any]:
    return plan_step(JOB, {"argv": ["cat"], **body})


def test_every_task_reads_srun_input_unless_one_or_none_is_named():
    assert plan()["input"] == "all"  # Slurm's default (--input=all)
    assert plan(input="none")["input"] == "none"
    assert plan(ntasks=4, input=3)["input"] == 3
    assert plan()["pty"] is None
    assert plan(pty=[132, 43])["pty"] == [132, 43]


def test_a_rank_the_step_lacks_is_refused_in_sruns_words():
    # Slurm takes `-i 7` for a file name when the step has fewer tasks: it cannot open it.
    with pytest.raises(Refused, match="^Could not open stdin file: No such file or directory$"):
        plan(ntasks=2, input=7)


@pytest.mark.parametrize(
    "body",
    [
        {"input": "some"},
        {"input": -1},
        {"input": True},
        {"input": 1.5},
        {"pty": [80]},
        {"pty": [80, 24, 1]},
        {"pty": [80, 1001]},
        {"pty": [-1, 24]},
        {"pty": ["80", "24"]},
        {"pty": True},
        {"stdin": "aGVsbG8="},  # a whole input in the request is no more: it streams
    ],
)
def test_a_malformed_input_or_terminal_is_refused(body):
    with pytest.raises(Refused):
        plan(**body)
