"""`scancel`: ids, signals, filters, and Slurm's silence about finished jobs."""

from __future__ import annotations

import pytest

from scheduler.cli import scancel
from scheduler.cli.scancel import UsageError, matching_jobs, parse_args, parse_signal
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.golden import capture, compares
from tests.scheduler.slurm.scene import job, scene_jobs


@pytest.mark.parametrize(
    ("text", "number"),
    [("USR2", 12), ("SIGUSR2", 12), ("usr1", 10), ("9", 9), ("KILL", 9), ("TERM", 15)],
)
def test_signals_are_named_with_or_without_sig_or_numbered(text: str, number: int) -> None:
    assert parse_signal(text) == number


@pytest.mark.parametrize("text", ["FOO", "0", "999", "", "SIG"])
def test_unknown_signals_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="Invalid job signal"):
        parse_signal(text)


def test_ids_and_options_mix_in_any_order() -> None:
    args = parse_args(["12", "-s", "USR1", "13,14"])
    assert (args.job_ids, args.signal) == ([12, 13, 14], 10)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["abc"], "Invalid job id abc"),
        (["17_[1-"], "Invalid job id 17_\\[1-"),
        (["--bogus"], "unrecognized option '--bogus'"),
        (["-t", "nope"], "Invalid job state"),
    ],
)
def test_bad_ids_and_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


def test_filters_choose_among_live_jobs() -> None:
    jobs = [*scene_jobs(), job(9, "done", "COMPLETED")]
    assert matching_jobs(jobs, parse_args(["-t", "PD"]), "root") == [13, 14, 15]
    assert matching_jobs(jobs, parse_args(["--name=six"]), "root") == [12]
    assert matching_jobs(jobs, parse_args(["-u", "bob"]), "root") == []
    assert matching_jobs(jobs, parse_args(["--me", "-p", "gpu"]), "root") == [
        10,
        11,
        12,
        13,
        14,
        15,
    ]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = scancel.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_it_cancels_each_job_given(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.jobs = {12: {"job_id": 12}, 14: {"job_id": 14}}
    assert run(capsys, "12", "14", "--signal=SIGUSR2") == (0, "", "")
    posted = [(r[1], r[3]) for r in fake_api.requests if r[0] == "POST"]
    assert posted == [
        ("/api/v1/jobs/12/cancel", {"signal": 12}),
        ("/api/v1/jobs/14/cancel", {"signal": 12}),
    ]


def test_an_array_id_cancels_every_task_and_a_task_range_those_tasks(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.queue = [
        {"job_id": i, "array_job_id": 20, "array_task_id": i - 20, "state": "PENDING"}
        for i in range(20, 25)
    ]
    fake_api.jobs = {int(j["job_id"]): j for j in fake_api.queue}
    assert run(capsys, "20_[1-2],20_4") == (0, "", "")
    posted = [r[1] for r in fake_api.requests if r[0] == "POST"]
    assert posted == ["/api/v1/jobs/21/cancel", "/api/v1/jobs/22/cancel", "/api/v1/jobs/24/cancel"]
    fake_api.requests.clear()
    assert run(capsys, "20") == (0, "", "")
    assert len([r for r in fake_api.requests if r[0] == "POST"]) == 5


@compares(("32_scancel_unknown.txt", "scancel 999999"))
def test_an_unknown_job_is_silent_like_slurm(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = capture("32_scancel_unknown.txt", "scancel 999999")
    assert run(capsys, "999999") == (golden.exit_code, golden.stdout, golden.stderr)


@compares(("32_scancel_unknown.txt", "scancel -v 999999"))
def test_verbose_tells_about_an_unknown_job_like_slurm(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = capture("32_scancel_unknown.txt", "scancel -v 999999")
    assert run(capsys, "-v", "999999") == (golden.exit_code, golden.stdout, golden.stderr)


@compares(("32_scancel_unknown.txt", "scancel --name=nosuchname"))
def test_a_name_that_matches_nothing_is_silent_like_slurm(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.queue = scene_jobs()
    golden = capture("32_scancel_unknown.txt", "scancel --name=nosuchname")
    assert run(capsys, "--name=nosuchname") == (golden.exit_code, golden.stdout, golden.stderr)


def test_filters_cancel_what_they_match(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.queue = scene_jobs()
    fake_api.jobs = {j["job_id"]: j for j in scene_jobs()}
    assert run(capsys, "-t", "PENDING", "-u", "root")[0] == 0
    cancelled = [r[1] for r in fake_api.requests if r[0] == "POST"]
    assert cancelled == [f"/api/v1/jobs/{i}/cancel" for i in (13, 14, 15)]


def test_nothing_to_cancel_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys) == (1, "", "scancel: error: No job identification provided\n")
