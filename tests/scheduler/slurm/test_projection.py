"""squeue and sacct ask the API only for the job fields their columns read (`fields_for`,
from each column's declared reads). Every column must print the same from a job cut to
those fields as from the whole job object, or a column would print a default where the
real value was left behind on the server."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from scheduler.core.contract.job_object import FIELD_NAMES, select_fields
from scheduler.slurm import sacct_format, sacct_records, squeue_format
from scheduler.slurm.columns import Field
from tests.scheduler.slurm.scene import NOW, iso, job, scene_jobs


def api_jobs() -> list[dict[str, Any]]:
    """Job objects as a list answer holds them (the GPU model at the top, no spec), in
    every shape the columns tell apart."""
    started = NOW - timedelta(minutes=5)
    step = {
        "step_id": 0,
        "name": "hostname",
        "nodes": ["gpu01"],
        "ntasks": 2,
        "cpus": 2,
        "state": "COMPLETED",
        "start_time": started.timestamp(),
        "end_time": (started + timedelta(seconds=3)).timestamp(),
        "exit_code": 0,
        "signal": 0,
    }
    extra = [
        job(20, "arr", "PENDING", reason="JobArrayTaskLimit", array_job_id=20, array_task_id=0),
        job(
            21,
            "arr",
            "RUNNING",
            nodes=["gpu02"],
            start=started,
            array_job_id=20,
            array_task_id=1,
            array_throttle=2,
            gpu_type="mi300x",
            gpus_per_node=2,
        ),  # fmt: skip
        job(
            22,
            "done",
            "COMPLETED",
            nodes=["gpu01"],
            start=started,
            end=NOW,
            exit_code=0,
            signal=0,
            time_limit_min=60,
            comment="a note",
            steps=[step],
        ),  # fmt: skip
        job(
            23,
            "oom",
            "OUT_OF_MEMORY",
            nodes=["gpu03"],
            start=started,
            end=NOW,
            exit_code=0,
            signal=9,
            stdout="/home/alice/out-%j-%x-%u-%N.txt",
            stderr="err-%j",
        ),  # fmt: skip
        job(
            24,
            "gone",
            "CANCELLED",
            start=None,
            end=NOW,
            interactive=True,
            priority=7,
            dependency="afterok:22",
            qos="high",
            eligible_time=iso(started),
        ),  # fmt: skip
    ]
    out = []
    for whole in [*scene_jobs(), *extra]:
        spec = whole.pop("spec", {})
        whole.setdefault("gpu_type", spec.get("gpu_type", ""))
        out.append(whole)
    return out


def cut(job: dict[str, Any], fields: list[str] | tuple[str, ...]) -> dict[str, Any]:
    return {k: job[k] for k in select_fields(fields) if k in job}


def test_every_column_reads_fields_of_the_job_object() -> None:
    for _, reads, _ in squeue_format.FIELDS.values():
        assert set(reads) <= set(FIELD_NAMES)
    for _, _, reads, _ in sacct_format.FIELDS.values():
        assert set(reads) - sacct_format.LOCAL_ONLY <= set(FIELD_NAMES)
    assert not sacct_format.LOCAL_ONLY & set(FIELD_NAMES)  # what no list answer holds
    assert set(squeue_format.SELECTION) <= set(FIELD_NAMES)
    assert set(sacct_format.SELECTION) | set(sacct_format.STEP_FIELDS) <= set(FIELD_NAMES)


@pytest.mark.parametrize("key", sorted(squeue_format.FIELDS))
def test_a_squeue_column_prints_the_same_from_the_fields_it_asks_for(key: str) -> None:
    fields = squeue_format.fields_for([Field(key)])
    wholes = api_jobs()
    whole_lines = squeue_format.format_jobs(wholes, [Field(key)], now=NOW, header=False)
    cut_jobs = [cut(whole, fields) for whole in wholes]
    assert squeue_format.format_jobs(cut_jobs, [Field(key)], now=NOW, header=False) == whole_lines


@pytest.mark.parametrize("name", sorted(sacct_format.FIELDS))
@pytest.mark.parametrize("allocations_only", [False, True])
def test_a_sacct_column_prints_the_same_from_the_fields_it_asks_for(
    name: str, allocations_only: bool
) -> None:
    columns = sacct_format.parse_fields(name)
    fields = sacct_format.fields_for(columns, allocations_only=allocations_only)
    wholes = api_jobs()
    expected = sacct_records.records(wholes, now=NOW, allocations_only=allocations_only)
    got = sacct_records.records(
        [cut(j, fields) for j in wholes], now=NOW, allocations_only=allocations_only
    )
    assert [r.step for r in got] == [r.step for r in expected]  # the same rows, steps too
    whole_values = sacct_records.format_sacct(expected, columns, parsable="P")  # nothing cut
    assert sacct_records.format_sacct(got, columns, parsable="P") == whole_values
