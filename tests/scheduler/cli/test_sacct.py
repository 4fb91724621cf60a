"""`sacct`: options, the query it sends, and the command against a loopback web API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.cli import sacct
from scheduler.cli.sacct import SacctArgs, UsageError, parse_args, select_jobs
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.golden import capture, compares
from tests.scheduler.slurm.scene import job

NOW = datetime(2026, 11, 30, 15, 30, tzinfo=UTC)


def query(args: SacctArgs) -> dict[str, str]:
    params = sacct.query(args)
    del params["fields"]  # test_only_the_fields_printed_travel
    return params


def test_only_the_fields_printed_travel() -> None:
    def fields(argv: list[str]) -> set[str]:
        return set(sacct.query(parse_args(argv, NOW))["fields"].split(","))

    chosen = {"job_id", "array_job_id", "array_task_id", "state", "name", "user", "account"}
    chosen |= {"array_tasks"}  # an array's pending remainder is one row: 17_[2-5]
    chosen |= {"partition", "start_time", "interactive"}  # sacct's own filters and rows
    assert fields(["-X", "-o", "JobID"]) == chosen
    assert fields(["-o", "JobID"]) == chosen | {"steps", "allocation"}  # the step rows
    assert fields(["-X", "-o", "End,WorkDir"]) == chosen | {"end_time", "workdir"}


def test_the_history_starts_at_midnight_unless_jobs_are_named() -> None:
    assert query(parse_args([], NOW)) == {
        "since": "2026-11-30T00:00:00Z",
        "limit": str(sacct.PAGE_SIZE),
    }
    assert query(parse_args(["-j", "16", "-j", "18,19"], NOW)) == {
        "id": "16,18,19",
        "limit": str(sacct.PAGE_SIZE),
    }


def test_filters_become_query_parameters() -> None:
    args = parse_args(
        [
            "-S",
            "now-1hours",
            "-E",
            "2026-11-30T15:00",
            "-s",
            "CD,F,TO,CA",
            "--name=x",
            "-u",
            "root",
        ],
        NOW,
    )
    assert query(args) == {
        "since": "2026-11-30T14:30:00Z",
        "until": "2026-11-30T15:00:00Z",
        "state": "CANCELLED,COMPLETED,FAILED,TIMEOUT",
        "name": "x",
        "user": "root",
        "limit": str(sacct.PAGE_SIZE),
    }
    several = parse_args(["-u", "b,a", "-A", "x,y", "-r", "gpu", "--name=p,q"], NOW)
    assert {k: v for k, v in query(several).items() if k not in ("since", "limit")} == {
        "user": "a,b",
        "account": "x,y",
        "partition": "gpu",
    }  # several names are matched on our side: a job's name may hold a comma


def test_array_and_step_ids_name_their_job() -> None:
    assert parse_args(["-j", "17_0,26.batch"], NOW).job_ids == [17, 26]


def test_a_task_or_a_step_named_prints_that_row_alone(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    started, ended = "2026-11-30T15:00:00Z", "2026-11-30T15:01:00Z"
    step = {"step_id": 0, "name": "hostname", "nodes": ["gpu01"], "cpus": 1,
            "state": "COMPLETED", "start_time": 1796050800, "end_time": 1796050810,
            "exit_code": 0, "signal": 0}  # fmt: skip
    done = {"start_time": started, "end_time": ended, "exit_code": 0, "signal": 0}
    fake_api.history = [
        job(17, "arr", "COMPLETED", array_job_id=17, array_task_id=0, **done),
        job(18, "arr", "COMPLETED", array_job_id=17, array_task_id=1, **done),
        job(26, "steps", "COMPLETED", nodes=["gpu01"], steps=[step], **done),
    ]

    def shown(ids: str) -> list[str]:
        assert sacct.main(["-j", ids, "-n", "-P", "-o", "JobID,JobName"]) == 0
        return capsys.readouterr().out.splitlines()

    assert shown("26") == ["26|steps", "26.batch|batch", "26.0|hostname"]
    assert shown("26.batch") == ["26.batch|batch"]
    assert shown("26.0,17_1") == ["17_1|arr", "17_1.batch|batch", "26.0|hostname"]
    assert shown("17") == ["17_0|arr", "17_0.batch|batch", "17_1|arr", "17_1.batch|batch"]
    assert shown("26.7") == []


def test_output_options_are_parsed() -> None:
    args = parse_args(["-X", "-n", "-P", "--delimiter=,", "-o", "JobID,State%20"], NOW)
    assert (args.allocations_only, args.header, args.parsable, args.delimiter) == (
        True,
        False,
        "P",
        ",",
    )
    assert [(c.name, c.width) for c in args.columns] == [("JobID", 12), ("State", 20)]
    assert [c.name for c in parse_args(["-b"], NOW).columns] == ["JobID", "State", "ExitCode"]
    assert parse_args(["-p"], NOW).parsable == "p"


def test_filters_apply_on_our_side_too() -> None:
    ended = NOW - timedelta(minutes=5)
    jobs = [job(i, name, state, end=ended) for i, name, state in
            ((1, "a", "COMPLETED"), (2, "b", "FAILED"), (3, "a", "FAILED"))]  # fmt: skip
    args = parse_args(["--name=a,b", "-s", "F", "-S", "now-1hours", "-E", "now"], NOW)
    assert [j["job_id"] for j in select_jobs(jobs, args)] == [2, 3]


def test_states_without_an_end_ask_for_the_moment_the_window_starts() -> None:
    # sacct(1): with -s, -S defaults to now and -E to -S; a job that ended later (or
    # earlier: the API's window) was not yet in that state then.
    args = parse_args(["-s", "F"], NOW)
    assert args.since == args.until == NOW.timestamp()
    args = parse_args(["-s", "CD", "-S", "now-1hours"], NOW)
    assert args.since == args.until == (NOW - timedelta(hours=1)).timestamp()
    done = job(1, "a", "COMPLETED", end=NOW - timedelta(minutes=5))
    assert select_jobs([done], args) == []
    running = job(2, "b", "RUNNING", start=NOW - timedelta(hours=2))
    assert select_jobs([running], parse_args(["-s", "R", "-S", "now-1hours"], NOW)) == [running]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "sacct: unrecognized option '--bogus'"),
        (["-j", "x"], "sacct: error: Invalid job id: x"),
        (["-j", "26.foo"], "sacct: error: Invalid job id: 26.foo"),
        (["-j", "17_x"], "sacct: error: Invalid job id: 17_x"),
        (["-S", "someday"], "sacct: error: Invalid time specification: someday"),
        (["-o", "JobID,Bogus"], 'sacct: error: Invalid field requested: "Bogus"'),
        (["-s", "XX"], "sacct: error: Invalid job state specified: XX"),
        (["stray"], "sacct: error: Unknown arguments: stray"),
    ],
)
def test_bad_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_args(argv, NOW)
    assert str(caught.value) == message


@compares(("63_sacct_misc.txt", "sacct --bogus"))
def test_an_unknown_option_fails_like_slurm(capsys: pytest.CaptureFixture[str]) -> None:
    golden = capture("63_sacct_misc.txt", "sacct --bogus")
    assert sacct.main(["--bogus"]) == golden.exit_code
    assert capsys.readouterr() == (golden.stdout, golden.stderr)


def test_the_command_prints_history_like_slurm(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.history = []
    golden = capture("63_sacct_misc.txt", "sacct -j 999999")
    assert sacct.main(["-j", "999999"]) == 0
    assert capsys.readouterr().out == golden.stdout
    assert {k: v for k, v in fake_api.requests[0][2].items() if k != "fields"} == {
        "id": ["999999"],
        "limit": [str(sacct.PAGE_SIZE)],
        "shape": ["runs"],  # a list per field (or its runs), not an object per job
    }
    fake_api.history = [job(1, "wrap", "FAILED", exit_code=1), job(2, "x", "PENDING")]
    assert sacct.main(["-X", "-n", "-P", "-o", "JobID,State,ExitCode"]) == 0
    assert capsys.readouterr().out == "1|FAILED|1:0\n2|PENDING|0:0\n"


def test_an_array_job_id_selects_every_task_of_the_array() -> None:
    tasks = [
        dict(job(i, "a", "COMPLETED"), array_job_id=10, array_task_id=i - 10) for i in (10, 11, 12)
    ]
    other = job(13, "b", "COMPLETED")
    args = parse_args(["-j", "10"], NOW)
    assert [j["job_id"] for j in select_jobs([*tasks, other], args)] == [10, 11, 12]
