"""squeue's columns, compared byte for byte with Slurm 22.05's (golden files 05, 21-26)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.slurm import squeue_format, states
from scheduler.slurm.columns import Field
from scheduler.slurm.squeue_format import (
    DEFAULT_FORMAT,
    as_columns,
    format_jobs,
    order_by_start,
    parse_format,
    parse_long_format,
    sort_jobs,
)
from tests.scheduler.slurm.golden import capture, compares
from tests.scheduler.slurm.scene import NOW, iso, job, scene_jobs


def lines(text: str) -> list[str]:
    return text.splitlines()


def squeue(fmt: str = DEFAULT_FORMAT, *, header: bool = True, long: bool = False) -> list[str]:
    pieces = parse_long_format(fmt) if long else parse_format(fmt)
    return format_jobs(sort_jobs(scene_jobs()), pieces, now=NOW, header=header)


@compares(("05_squeue_empty.txt", "squeue"))
def test_an_empty_queue_prints_only_the_header() -> None:
    expected = capture("05_squeue_empty.txt", "squeue").stdout
    assert format_jobs([], parse_format(DEFAULT_FORMAT), now=NOW) == lines(expected)


@compares(("21_squeue_default.txt", "squeue"))
def test_the_default_format_matches_slurm() -> None:
    assert squeue() == lines(capture("21_squeue_default.txt", "squeue").stdout)


@compares(("23_squeue_noheader.txt", "squeue --noheader"))
def test_noheader_drops_only_the_header() -> None:
    expected = capture("23_squeue_noheader.txt", "squeue --noheader").stdout
    assert squeue(header=False) == lines(expected)


@compares(("22_squeue_format_i_j_T_R.txt", "squeue -o '%i %j %T %R'"))
def test_a_format_without_widths_prints_whole_values() -> None:
    expected = capture("22_squeue_format_i_j_T_R.txt", "squeue -o '%i %j %T %R'").stdout
    assert squeue("%i %j %T %R") == lines(expected)


@compares(("26_pending_reasons.txt", "squeue -t PD -o '%.8i %.10j %.8T %r'"))
def test_dotted_widths_right_justify_and_the_reason_is_bare_with_r() -> None:
    golden = capture("26_pending_reasons.txt", "squeue -t PD -o '%.8i %.10j %.8T %r'")
    pending = [j for j in sort_jobs(scene_jobs()) if j["state"] == "PENDING"]
    out = format_jobs(pending, parse_format("%.8i %.10j %.8T %r"), now=NOW)
    assert out == lines(golden.stdout)


@compares(
    (
        "24_squeue_O_fields.txt",
        "squeue -O JobID,Name,UserName,State,NumNodes,NodeList,Reason,tres-per-node",
    )
)
def test_the_long_format_names_match_slurm() -> None:
    golden = capture(
        "24_squeue_O_fields.txt",
        "squeue -O JobID,Name,UserName,State,NumNodes,NodeList,Reason,tres-per-node",
    )
    fmt = "JobID,Name,UserName,State,NumNodes,NodeList,Reason,tres-per-node"
    assert squeue(fmt, long=True) == lines(golden.stdout)


@compares(
    (
        "24_squeue_O_fields.txt",
        "squeue -O 'JobID:10,Partition:8,StateCompact:4,TimeUsed:10,TimeLimit:12,"
        "NumCPUs:6,ReasonList:30'",
    )
)
def test_long_format_widths_cut_values_without_a_separator() -> None:
    fmt = "JobID:10,Partition:8,StateCompact:4,TimeUsed:10,TimeLimit:12,NumCPUs:6,ReasonList:30"
    golden = capture("24_squeue_O_fields.txt", f"squeue -O '{fmt}'")
    assert squeue(fmt, long=True) == lines(golden.stdout)


def test_pending_jobs_sort_before_running_ones_then_by_id() -> None:
    assert [j["job_id"] for j in sort_jobs(scene_jobs())] == [13, 14, 15, 10, 11, 12]


@compares(("13_sbatch_unsatisfiable_gres.txt", "squeue -j 7 -o '%i %T %r'"))
def test_a_pending_reason_is_shown_in_parentheses() -> None:
    golden = capture("13_sbatch_unsatisfiable_gres.txt", "squeue -j 7 -o '%i %T %r'")
    pending = job(7, "wrap", "PENDING", reason="PartitionNodeLimit", num_nodes=5)
    assert format_jobs([pending], parse_format("%i %T %r"), now=NOW) == lines(golden.stdout)
    assert format_jobs([pending], parse_format("%R"), now=NOW, header=False) == [
        "(PartitionNodeLimit)"
    ]


def test_elapsed_time_grows_to_hours_and_days() -> None:
    started = job(1, "x", "RUNNING", nodes=["gpu01"], start=NOW - timedelta(days=1, seconds=3723))
    assert format_jobs([started], parse_format("%M"), now=NOW, header=False) == ["1-01:02:03"]


def test_time_limits_print_like_slurm() -> None:
    limited = job(1, "x", "PENDING", time_limit_min=90)
    unlimited = job(2, "y", "PENDING")
    out = format_jobs([limited, unlimited], parse_format("%l"), now=NOW, header=False)
    assert out == ["1:30:00", "UNLIMITED"]


def test_times_and_other_fields_have_slurm_headers(utc: None) -> None:
    pieces = parse_format("%S|%V|%e|%a|%q|%Q|%A|%C|%P|%N|%b|%u|%D")
    running = scene_jobs()[0]
    header, row = format_jobs([running], pieces, now=NOW)
    assert header == (
        "START_TIME|SUBMIT_TIME|END_TIME|ACCOUNT|QOS|PRIORITY|JOBID|CPUS|PARTITION|"
        "NODELIST|TRES_PER_NODE|USER|NODES"
    )
    assert row == (
        "2026-11-30T04:05:42|2026-11-30T04:05:35|N/A|root|normal|0|12|1|gpu|gpu04|gres:gpu:6|root|1"
    )


def test_a_pending_job_has_no_start_time_yet() -> None:
    pending = job(1, "x", "PENDING")
    assert format_jobs([pending], parse_format("%S %N."), now=NOW, header=False) == ["N/A ."]


def test_typed_gpus_show_in_tres_per_node() -> None:
    typed = job(3, "named", "PENDING", gpus_per_node=1, gpu_type="mi300x")
    assert format_jobs([typed], parse_format("%b"), now=NOW, header=False) == ["gres:gpu:mi300x:1"]


def test_an_unknown_format_letter_is_an_error() -> None:
    with pytest.raises(ValueError, match="Invalid job format specification"):
        parse_format("%i %z")


def test_an_unknown_long_field_is_an_error() -> None:
    with pytest.raises(ValueError, match="Invalid job format specification: Bogus"):
        parse_long_format("JobID,Bogus")


def test_long_fields_take_a_right_justify_dot_and_a_suffix() -> None:
    assert parse_long_format("jobid:.6|") == [Field("jobid_raw", 6, True, suffix="|")]
    out = format_jobs([job(7, "x", "PENDING")], parse_long_format("jobid:.6|"), now=NOW)
    assert out == [" JOBID|", "     7|"]


@given(st.text(alphabet=st.sampled_from(".0123456789٣a|: "), max_size=10))
def test_a_long_fields_width_and_suffix_are_read_as_a_pattern_reads_them(rest: str) -> None:
    """Read by hand, without `re` at squeue's start: as `^(\\.)?(\\d+)?(.*)$` reads them."""
    item = f"JobID:{rest}"
    match = re.match(r"^(\.)?(\d+)?(.*)$", item.strip().partition(":")[2])
    assert match is not None
    dot, width, suffix = match.groups()
    expected = Field("jobid_raw", int(width) if width else 20, dot is not None, suffix=suffix)
    assert parse_long_format(item) == [expected]


def test_a_pending_job_expected_to_start_shows_when_where_and_until_when(utc: None) -> None:
    expected = NOW + timedelta(hours=1)
    limited = job(1, "x", "PENDING", time_limit_min=30, expected_start=iso(expected),
                  sched_nodes=["gpu01", "gpu02"])  # fmt: skip
    unlimited = job(2, "y", "PENDING", expected_start=iso(expected), sched_nodes=["gpu03"])
    unknown = job(3, "z", "PENDING", time_limit_min=30)
    out = format_jobs([limited, unlimited, unknown], parse_format("%S|%e|%Y"), now=NOW)
    assert out == [
        "START_TIME|END_TIME|SCHEDNODES",
        "2026-11-30T05:05:45|2026-11-30T05:35:45|gpu[01-02]",
        "2026-11-30T05:05:45|NONE|gpu03",
        "N/A|N/A|(null)",
    ]
    assert parse_long_format("SchedNodes") == [Field("sched_nodes", 20)]


def test_start_order_is_by_start_a_due_one_counting_as_now_and_the_unknown_last() -> None:
    def at(seconds: float) -> str | None:
        return iso(NOW + timedelta(seconds=seconds))

    jobs = [
        job(5, "later", "PENDING", expected_start=at(600)),
        job(4, "unknown", "PENDING"),
        job(3, "due", "PENDING", expected_start=at(-600)),  # a stale estimate: now
        job(2, "ran", "RUNNING", start=NOW - timedelta(seconds=60), nodes=["gpu01"]),
        job(1, "now", "PENDING", expected_start=at(0)),
        job(6, "unknown too", "PENDING"),
    ]
    cols = as_columns(jobs)
    ordered = order_by_start(cols, range(len(jobs)), NOW.timestamp())
    assert [jobs[i]["job_id"] for i in ordered] == [2, 1, 3, 5, 4, 6]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["gpu", "cpu", None]),
            st.sampled_from(["PENDING", "RUNNING", "SUSPENDED", "NOT_A_STATE"]),
            st.one_of(st.none(), st.integers(0, 3)),
        ),
        max_size=30,
    ),
    st.randoms(use_true_random=False),
)
def test_the_default_order_is_partition_state_then_priority_high_first(
    jobs: list[tuple[str | None, str, int | None]], rnd: Any
) -> None:
    """`order` (a stable sort a key at a time, constant keys skipped) is squeue's `P,t,-p`
    then the job id, as one lexicographic sort has it, for any subset of rows in any
    order."""
    ids = list(range(100, 100 + len(jobs)))
    cols: dict[str, list[Any]] = {
        "job_id": ids,
        "partition": [j[0] for j in jobs],
        "state": [j[1] for j in jobs],
        "priority": [j[2] for j in jobs],
    }
    rows = [i for i in range(len(jobs)) if rnd.random() < 0.8]
    rnd.shuffle(rows)
    rank = states.ORDER.get
    expected = sorted(
        rows,
        key=lambda i: (
            cols["partition"][i] or "",
            rank(cols["state"][i], 99),
            -(cols["priority"][i] or 0),
            ids[i],
        ),
    )
    assert squeue_format.order(cols, rows) == expected
