"""Array job ids as squeue, sacct and scancel write them (golden 41, 42)."""

from __future__ import annotations

from typing import Any

import pytest

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
