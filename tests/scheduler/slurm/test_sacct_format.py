"""sacct's columns and step rows against Slurm 22.05's (golden files 40-43, 60-63)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from scheduler.slurm.sacct_format import DEFAULT_FIELDS, parse_fields
from scheduler.slurm.sacct_records import format_sacct, records
from tests.scheduler.slurm.golden import capture, compares, differs
from tests.scheduler.slurm.scene import NOW, job

T0 = NOW - timedelta(hours=1)

# (id, name, state, cpus, exit_code, signal, seconds run or None if it never started)
HISTORY: list[tuple[int, str, str, int, int, int, int | None]] = [
    (1, "wrap", "COMPLETED", 1, 0, 0, 2),
    (2, "wrap", "COMPLETED", 1, 0, 0, 2),
    (3, "named", "COMPLETED", 1, 0, 0, 2),
    (4, "wrap", "FAILED", 1, 1, 0, None),
    (7, "wrap", "CANCELLED", 5, 0, 0, None),
    (9, "wrap", "FAILED", 65, 1, 0, None),
    (10, "big2n", "CANCELLED", 2, 0, 15, 39),
    (11, "full8", "CANCELLED", 1, 0, 15, 42),
    (13, "wait_res", "CANCELLED", 1, 0, 15, 4),
    (14, "wait_prio", "CANCELLED", 1, 0, 0, None),
    (16, "timeout", "TIMEOUT", 1, 0, 15, 68),
    (18, "chainA", "COMPLETED", 1, 0, 0, 5),
    (24, "fail3", "FAILED", 1, 3, 0, 0),
    (25, "env2", "COMPLETED", 1, 0, 0, 0),
]


def history_job(
    job_id: int, name: str, state: str, cpus: int, code: int, signal: int, ran: int | None
) -> dict[str, Any]:
    start = T0 + timedelta(minutes=job_id) if ran is not None else None
    end = (start + timedelta(seconds=ran)) if start is not None and ran is not None else T0
    nodes = ["gpu01", "gpu02"][:cpus] if start is not None else []
    return job(
        job_id,
        name,
        state,
        nodes=nodes,
        num_nodes=max(len(nodes), 1),
        num_cpus=cpus,
        start=start,
        end=end,
        exit_code=code,
        signal=signal,
        time_limit_min=1 if name == "timeout" else None,
    )


def history() -> list[dict[str, Any]]:
    return [history_job(*row) for row in HISTORY]


def golden_lines(name: str, command: str) -> list[str]:
    """The golden output for the jobs HISTORY rebuilds (headers kept)."""
    ids = {str(row[0]) for row in HISTORY}
    out = []
    for line in capture(name, command).stdout.splitlines():
        first = line.split("|")[0].split(" ")[0].split(".")[0]
        if first in ids or not first[:1].isdigit():
            out.append(line)
    return out


def sacct(
    fields: str = DEFAULT_FIELDS,
    *,
    steps: bool = True,
    jobs: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> list[str]:
    rows = records(jobs if jobs is not None else history(), now=NOW, allocations_only=not steps)
    return format_sacct(rows, parse_fields(fields), **kw)


@differs(("60_sacct_default.txt", "sacct"))
def test_the_default_listing_matches_slurm() -> None:
    assert sacct() == golden_lines("60_sacct_default.txt", "sacct")


@differs(("61_sacct_parsable_format.txt", "sacct -P --format=JobID,JobName,State,ExitCode,Elapsed"))
def test_parsable2_output_matches_slurm() -> None:
    command = "sacct -P --format=JobID,JobName,State,ExitCode,Elapsed"
    expected = golden_lines("61_sacct_parsable_format.txt", command)
    assert sacct("JobID,JobName,State,ExitCode,Elapsed", parsable="P") == expected


@differs(("62_sacct_X_n.txt", "sacct -X -n"))
def test_allocations_without_a_header_match_slurm() -> None:
    expected = golden_lines("62_sacct_X_n.txt", "sacct -X -n")
    assert sacct(steps=False, header=False) == expected


@compares(
    ("40_timeout_job.txt", "sacct -j 16"),
    (
        "40_timeout_job.txt",
        "sacct -j 16 -P --format=JobID,JobName,State,ExitCode,Elapsed,Timelimit",
    ),
)
def test_a_timed_out_job_matches_slurm() -> None:
    timeout = [history_job(16, "timeout", "TIMEOUT", 1, 0, 15, 68)]
    assert sacct(jobs=timeout) == capture("40_timeout_job.txt", "sacct -j 16").stdout.splitlines()
    command = "sacct -j 16 -P --format=JobID,JobName,State,ExitCode,Elapsed,Timelimit"
    expected = capture("40_timeout_job.txt", command).stdout.splitlines()
    fields = "JobID,JobName,State,ExitCode,Elapsed,Timelimit"
    assert sacct(fields, jobs=timeout, parsable="P") == expected


@compares(
    ("43_failing_job.txt", "sacct -j 24"),
    (
        "43_failing_job.txt",
        "sacct -j 24 -P --format=JobID,JobName,State,ExitCode,DerivedExitCode,Elapsed",
    ),
)
def test_a_failing_job_keeps_its_exit_code_on_both_rows() -> None:
    failed = [history_job(24, "fail3", "FAILED", 1, 3, 0, 0)]
    assert sacct(jobs=failed) == capture("43_failing_job.txt", "sacct -j 24").stdout.splitlines()
    command = "sacct -j 24 -P --format=JobID,JobName,State,ExitCode,DerivedExitCode,Elapsed"
    expected = capture("43_failing_job.txt", command).stdout.splitlines()
    fields = "JobID,JobName,State,ExitCode,DerivedExitCode,Elapsed"
    assert sacct(fields, jobs=failed, parsable="P") == expected


@compares(
    (
        "42_dependency_chain.txt",
        "sacct -X -j 18,19,20,21 --format=JobID,JobName,State,ExitCode,Start,End",
    )
)
def test_start_and_end_times_match_slurm(utc: None) -> None:
    def at(second: str) -> Any:
        return NOW.replace(minute=int(second[:2]), second=int(second[3:]))

    chain = [
        job(
            18,
            "chainA",
            "COMPLETED",
            nodes=["gpu01"],
            start=at("06:28"),
            end=at("06:33"),
            exit_code=0,
        ),
        job(
            19,
            "chainB",
            "COMPLETED",
            nodes=["gpu01"],
            start=at("06:36"),
            end=at("06:38"),
            exit_code=0,
        ),
        job(
            20,
            "chainC",
            "COMPLETED",
            nodes=["gpu01"],
            start=at("06:39"),
            end=at("06:41"),
            exit_code=0,
        ),
        job(21, "chainX", "CANCELLED", end=at("07:09"), exit_code=0),
    ]
    command = "sacct -X -j 18,19,20,21 --format=JobID,JobName,State,ExitCode,Start,End"
    expected = capture("42_dependency_chain.txt", command).stdout.splitlines()
    assert sacct("JobID,JobName,State,ExitCode,Start,End", steps=False, jobs=chain) == expected


@compares(("63_sacct_misc.txt", "sacct -j 26 --format=JobID,JobName,NodeList,AllocTRES%60,State"))
def test_node_lists_and_allocated_tres_match_slurm() -> None:
    env2n = job(
        26,
        "env2n",
        "COMPLETED",
        nodes=["gpu01", "gpu02"],
        num_nodes=2,
        num_cpus=2,
        gpus_per_node=2,
        gpu_type="mi300x",
        start=T0,
        end=T0,
        exit_code=0,
    )
    for allocation in env2n["allocation"].values():
        allocation["mem_mb"] = 8192
    expected = capture(
        "63_sacct_misc.txt", "sacct -j 26 --format=JobID,JobName,NodeList,AllocTRES%60,State"
    ).stdout.splitlines()
    # Its script's `srun -l` over both nodes: step 0, one task (and CPU) on each.
    env2n["steps"] = [
        {"step_id": 0, "name": "bash", "nodes": ["gpu01", "gpu02"], "ntasks": 2, "cpus": 2,
         "state": "COMPLETED", "start_time": T0.timestamp(), "end_time": T0.timestamp() + 1,
         "exit_code": 0, "signal": 0}
    ]  # fmt: skip
    out = sacct("JobID,JobName,NodeList,AllocTRES%60,State", jobs=[env2n])
    assert out == expected


@compares(("63_sacct_misc.txt", "sacct -j 999999"))
def test_no_jobs_print_the_header_and_dashes() -> None:
    expected = capture("63_sacct_misc.txt", "sacct -j 999999").stdout.splitlines()
    assert sacct(jobs=[]) == expected


def test_parsable_output_ends_each_line_with_the_delimiter() -> None:
    out = sacct("JobID,State", steps=False, jobs=history()[:1], parsable="p")
    assert out == ["JobID|State|", "1|COMPLETED|"]
    out = sacct("JobID,State", steps=False, jobs=history()[:1], parsable="P", delimiter=",")
    assert out == ["JobID,State", "1,COMPLETED"]


def test_a_cancelled_job_names_who_cancelled_it() -> None:
    cancelled = job(5, "x", "CANCELLED", cancelled_by_uid=1000)
    assert sacct("State", jobs=[cancelled], parsable="P", header=False) == ["CANCELLED by 1000"]


def test_a_running_job_has_an_unknown_end_and_a_running_step() -> None:
    running = job(6, "x", "RUNNING", nodes=["gpu01"], start=NOW - timedelta(seconds=90))
    out = sacct(
        "JobID,State,Elapsed,End,Timelimit,User", jobs=[running], parsable="P", header=False
    )
    assert out == [
        "6|RUNNING|00:01:30|Unknown|UNLIMITED|root",
        "6.batch|RUNNING|00:01:30|Unknown||",
    ]


def test_requested_tres_count_gpus_and_memory() -> None:
    pending = job(8, "x", "PENDING", num_nodes=2, num_cpus=4, gpus_per_node=2)
    pending["spec"]["mem_per_node_mb"] = 4096
    out = sacct("ReqTRES%60,AllocTRES,NodeList", jobs=[pending], parsable="P", header=False)
    assert out == ["billing=4,cpu=4,gres/gpu=4,mem=8G,node=2||None assigned"]


def test_other_fields_print_their_values() -> None:
    one = job(
        9,
        "x",
        "COMPLETED",
        nodes=["gpu01"],
        start=T0,
        end=T0 + timedelta(days=1, hours=2),
        exit_code=0,
        comment="note",
        time_limit_min=3 * 24 * 60,
    )
    fields = "JobIDRaw,NNodes,NCPUS,User,Comment,Reason,Timelimit,Elapsed"
    out = sacct(fields, steps=False, jobs=[one], parsable="P", header=False)
    assert out == ["9|1|1|root|note|None|3-00:00:00|1-02:00:00"]


def test_field_names_ignore_case_and_take_a_width() -> None:
    columns = parse_fields("jobid,STATE%4")
    assert [(c.name, c.width, c.left) for c in columns] == [
        ("JobID", 12, True),
        ("State", 4, False),
    ]
    assert sacct("jobid,STATE%4", steps=False, jobs=history()[:1]) == [
        "JobID        Sta+ ",
        "------------ ---- ",
        "1            COM+ ",
    ]


def test_an_unknown_field_is_refused_with_slurms_words() -> None:
    with pytest.raises(ValueError, match='Invalid field requested: "Bogus"'):
        parse_fields("JobID,Bogus")
    with pytest.raises(ValueError):
        parse_fields("JobID%x")


def test_an_arrays_pending_remainder_is_one_row_as_in_slurm() -> None:
    ran = {**job(17, "arr", "COMPLETED", start=T0, end=T0 + timedelta(seconds=20))}
    ran.update(array_job_id=17, array_task_id=0, array_tasks="")
    rest = {**job(18, "arr", "PENDING"), "array_job_id": 17, "array_task_id": None}
    rest["array_tasks"] = "1-3"
    lines = sacct("JobID,JobName,State", steps=False, jobs=[ran, rest])
    assert [line.split() for line in lines[2:]] == [
        ["17_0", "arr", "COMPLETED"],
        ["17_[1-3]", "arr", "PENDING"],
    ]
