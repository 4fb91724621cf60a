"""`squeue`: options, filters, and the command against a web API on loopback."""

from __future__ import annotations

import pytest

from scheduler.cli import squeue
from scheduler.cli.squeue import UsageError, parse_args, select_jobs
from scheduler.slurm import squeue_format
from scheduler.slurm.states import ACTIVE
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.golden import capture, compares
from tests.scheduler.slurm.scene import NOW, job, scene_jobs


def ids(argv: list[str], me: str = "root") -> list[int]:
    jobs = [*scene_jobs(), job(9, "done", "COMPLETED"), job(8, "other", "PENDING", user="bob")]
    jobs[-1]["user"] = "bob"
    return [int(j["job_id"]) for j in select_jobs(jobs, parse_args(argv, {}), me)]


def test_only_live_jobs_are_listed_without_states() -> None:
    assert parse_args([], {}).states == ACTIVE
    assert ids([]) == [8, 13, 14, 15, 10, 11, 12]


def test_states_users_names_and_ids_filter() -> None:
    assert ids(["-t", "PD", "-u", "root"]) == [13, 14, 15]
    assert ids(["--states=all"]) == [8, 13, 14, 15, 10, 11, 12, 9]
    assert ids(["-t", "completed"]) == [9]
    assert ids(["--me"], me="bob") == [8]
    assert ids(["-n", "six,full8"]) == [11, 12]
    assert ids(["-j", "10,13"]) == [13, 10]
    assert ids(["-j", "9"]) == []  # ended: listed only with -t
    assert ids(["-p", "cpu"]) == []


def test_formats_come_from_options_then_the_environment() -> None:
    assert parse_args(["-o", "%i"], {"SQUEUE_FORMAT": "%j"}).pieces[0].key == "jobid"  # type: ignore[union-attr]
    assert parse_args([], {"SQUEUE_FORMAT": "%j"}).pieces[0].key == "name"  # type: ignore[union-attr]
    assert parse_args([], {"SQUEUE_FORMAT2": "UserName"}).pieces[0].key == "user"  # type: ignore[union-attr]
    assert parse_args(["-h"], {}).header is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "squeue: unrecognized option '--bogus'"),
        (["-j", "abc"], "squeue: error: Invalid job id: abc"),
        (["-t", "weird"], "squeue: error: Invalid job state specified: weird"),
        (["-o", "%z"], "squeue: error: Invalid job format specification"),
        (["stray"], "squeue: error: Unrecognized option: stray"),
    ],
)
def test_bad_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_args(argv, {})
    assert str(caught.value).startswith(message)


@compares(("25_squeue_me.txt", "squeue -u root -t PENDING"), ("25_squeue_me.txt", "squeue --me"))
def test_the_command_prints_the_queue_like_slurm(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_api.queue = scene_jobs()
    monkeypatch.setattr(squeue, "datetime", _FrozenClock)
    assert squeue.main(["-u", "root", "-t", "PENDING"]) == 0
    expected = capture("25_squeue_me.txt", "squeue -u root -t PENDING")
    assert capsys.readouterr().out == expected.stdout
    assert squeue.main(["--me"]) == 0
    assert capsys.readouterr().out == capture("25_squeue_me.txt", "squeue --me").stdout


@compares(("25_squeue_me.txt", "squeue -j 999999"))
def test_one_unknown_job_id_is_an_error_like_slurm(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.queue = scene_jobs()
    golden = capture("25_squeue_me.txt", "squeue -j 999999")
    assert squeue.main(["-j", "999999"]) == golden.exit_code
    out, err = capsys.readouterr()
    assert (out, err) == (golden.stdout, golden.stderr)


class _FrozenClock:
    @staticmethod
    def now(tz: object = None) -> object:
        return NOW


def test_the_filters_travel_to_the_server() -> None:
    def query(argv: list[str], me: str = "") -> dict[str, str]:
        params = squeue.query(parse_args(argv, {}), me)
        del params["fields"]  # test_only_the_fields_printed_travel
        return params

    assert query([]) == {"state": ",".join(sorted(ACTIVE & squeue.API_STATES))}
    assert query(["-j", "12_[1-2],10", "-t", "all", "-u", "b,a", "--me"], me="c") == {
        "id": "10,12",  # an array's tasks are picked on our side
        "user": "a,b,c",
    }
    assert query(["-p", "gpu,cpu", "-A", "x", "-n", "j1", "-t", "PD,R"]) == {
        "partition": "cpu,gpu",
        "account": "x",
        "name": "j1",
        "state": "PENDING,RUNNING",
    }
    # Slurm states Spur never gives: nothing to ask the server for.
    assert query(["-t", "BOOT_FAIL,DEADLINE"]) == {"state": ""}


def test_only_the_fields_printed_travel() -> None:
    def fields(argv: list[str]) -> set[str]:
        return set(squeue.query(parse_args(argv, {}), "")["fields"].split(","))

    chosen = {"job_id", "array_job_id", "array_task_id", "array_throttle", "state", "priority"}
    chosen |= {"partition", "user", "name", "account", "qos"}  # squeue's own filters and order
    assert fields(["-o", "%i"]) == chosen
    ran = {"start_time", "end_time", "suspended_at", "suspended_s"}  # TIME, less suspended
    assert fields([]) == chosen | ran | {"num_nodes", "reason", "nodes"}
    assert fields(["-O", "WorkDir,TimeLimit"]) == chosen | {"workdir", "time_limit_min"}


def test_the_server_is_asked_only_for_the_rows_printed(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.queue = scene_jobs()
    assert squeue.main(["-h", "-u", "root", "-t", "PD", "-p", "gpu"]) == 0
    assert fake_api.requests[0][2] == {
        "user": ["root"],
        "state": ["PENDING"],
        "partition": ["gpu"],
        "fields": [",".join(squeue_format.fields_for(parse_args([], {}).pieces))],
        "shape": ["runs"],  # a list per field (or its runs), not an object per job
    }
    asked = len(fake_api.requests)
    assert squeue.main(["-h", "-t", "BF"]) == 0
    assert len(fake_api.requests) == asked  # no state Spur gives: nothing asked
    assert capsys.readouterr().out.split() == [
        *["13", "gpu", "wait_res", "root", "PD", "0:00", "1", "(Resources)"],
        *["14", "gpu", "wait_pri", "root", "PD", "0:00", "1", "(Priority)"],
        *["15", "gpu", "wait_dep", "root", "PD", "0:00", "1", "(Dependency)"],
    ]


def test_it_prints_where_a_jobs_output_goes(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.queue = [
        job(21, "train", "PENDING", stdout="%x-%j.out", stderr="logs/%j.err"),
        job(22, "eval", "PENDING", stdout="", stderr=""),
    ]
    assert squeue.main(["-h", "-O", "JobID:4,StdOut:30,StdErr:30"]) == 0
    assert [line.rstrip() for line in capsys.readouterr().out.splitlines()] == [
        "21  /home/alice/work/train-21.out /home/alice/work/logs/21.err",
        "22  /home/alice/work/slurm-22.out /home/alice/work/slurm-22.out",
    ]


def test_start_lists_pending_jobs_unless_states_are_named_and_asks_what_orders_them() -> None:
    args = parse_args(["--start"], {})
    assert (args.start, args.states) == (True, frozenset({"PENDING"}))
    assert parse_args(["-t", "R", "--start"], {}).states == frozenset({"RUNNING"})
    assert parse_args(["--start", "-l"], {}).pieces == squeue_format.parse_format(
        squeue_format.START_FORMAT
    )
    asked = set(squeue.query(parse_args(["--start", "-o", "%i"], {}), "")["fields"].split(","))
    assert {"start_time", "expected_start", "state", "job_id"} <= asked
    assert "sched_nodes" not in asked  # not printed
    assert "expected_start" not in squeue.query(parse_args(["-o", "%i"], {}), "")["fields"]
