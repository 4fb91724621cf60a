"""Array job ids as squeue, sacct and scancel write them (golden 41, 42)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from scheduler.slurm.jobref import JobRef, collapse_pending, display_id, parse_job_ref


def task(job_id: int, array_id: int, index: int, state: str = "PENDING", **kw: Any) -> dict:
    return {
        "job_id": job_id,
        "array_job_id": array_id,
        "array_task_id": index,
        "state": state,
        **kw,
    }


def test_ids_parse_as_a_job_a_task_or_a_set_of_tasks():
    assert parse_job_ref("17") == JobRef(17)
    assert parse_job_ref("17_3") == JobRef(17, frozenset({3}))
    assert parse_job_ref("17_[1-3,5]") == JobRef(17, frozenset({1, 2, 3, 5}))
    for bad in ("x", "17_", "17_[3-1]", "_3"):
        with pytest.raises(ValueError):
            parse_job_ref(bad)


def test_an_array_job_id_matches_every_task():
    assert JobRef(17).matches(task(19, 17, 2))
    assert JobRef(17, frozenset({2})).matches(task(19, 17, 2))
    assert not JobRef(17, frozenset({1})).matches(task(19, 17, 2))
    assert JobRef(5).matches({"job_id": 5, "array_job_id": None})


def test_pending_tasks_collapse_into_one_line_with_the_throttle_like_golden_41():
    jobs = [
        task(17, 17, 0, "RUNNING", array_throttle=2),
        task(18, 17, 1, "RUNNING", array_throttle=2),
        task(19, 17, 2, array_throttle=2),
        task(20, 17, 3, array_throttle=2),
        {"job_id": 21, "array_job_id": None, "state": "PENDING"},
    ]
    shown = [display_id(j) for j in collapse_pending(jobs)]
    assert shown == ["17_0", "17_1", "17_[2-3%2]", "21"]


def test_a_lone_pending_task_without_throttle_shows_plainly():
    assert [display_id(j) for j in collapse_pending([task(9, 8, 1)])] == ["8_1"]


def remainder(job_id: int, array_id: int, tasks: str, **kw: Any) -> dict:
    """An array's pending remainder as the history keeps it: one row for its tasks."""
    return {**task(job_id, array_id, 0, **kw), "array_task_id": None, "array_tasks": tasks}


def test_a_pending_remainder_shows_as_slurms_sacct_shows_it_and_matches_its_tasks():
    rest = remainder(19, 17, "2-5,9")
    assert display_id(rest) == "17_[2-5,9]"
    assert JobRef(17).matches(rest)
    assert JobRef(17, frozenset({3})).matches(rest)
    assert JobRef(17, frozenset({1, 9})).matches(rest)
    assert not JobRef(17, frozenset({6})).matches(rest)
    assert not JobRef(18, frozenset({3})).matches(rest)


def test_a_remainder_and_the_pending_tasks_that_left_it_collapse_into_one_line():
    jobs = [
        task(17, 17, 0, "RUNNING", array_throttle=2),
        task(18, 17, 1, array_throttle=2),  # held on its own, say
        remainder(19, 17, "2-3", array_throttle=2),
    ]
    shown = [display_id(j) for j in collapse_pending(jobs)]
    assert shown == ["17_0", "17_[1-3%2]"]


@given(st.text(alphabet=st.sampled_from("0123456789٣ \n_x"), max_size=8))
def test_a_plain_id_is_read_as_the_pattern_reads_it(text: str) -> None:
    """Read without `re` (scancel's start): as `^(\\d+)(?:_(...))?$` reads it."""
    match = re.match(r"^(\d+)(?:_(\d+|\[[^\]]+\]))?$", text.strip())
    assume(match is None or match.group(2) is None)  # a task or set of tasks: the pattern's
    if match is None:
        with pytest.raises(ValueError, match="Invalid job id"):
            parse_job_ref(text)
    else:
        assert parse_job_ref(text) == JobRef(int(match.group(1)))
