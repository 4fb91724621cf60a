"""`spur output JOBID [-f] [--stderr]` against a web API on loopback, whose job output
grows between reads as a running job's does."""

from __future__ import annotations

import pytest

from scheduler.cli import output, spur
from scheduler.cli.output import UsageError, parse_args
from tests.scheduler.cli.fake_api import FakeApi


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "POLL_S", 0.0)


def reads(api: FakeApi) -> list[tuple[str, str]]:
    return [
        (q.get("stream", [""])[0], q.get("offset", [""])[0])
        for method, path, q, _ in api.requests
        if path.endswith("/output")
    ]


def test_it_prints_what_there_is_in_chunks_and_stops(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.jobs[7] = {"job_id": 7, "state": "RUNNING"}
    fake_api.outputs[(7, "stdout")] = [("hello world\n", True)]
    assert spur.main(["output", "7"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    # 4 bytes a read: it reads on from each next_offset until it has the whole size.
    assert reads(fake_api) == [("stdout", "0"), ("stdout", "4"), ("stdout", "8")]


def test_stderr_is_its_own_stream(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.jobs[7] = {"job_id": 7, "state": "COMPLETED"}
    fake_api.outputs[(7, "stdout")] = [("out\n", False)]
    fake_api.outputs[(7, "stderr")] = [("err\n", False)]
    assert spur.main(["output", "--stderr", "7"]) == 0
    assert capsys.readouterr().out == "err\n"


def test_follow_waits_for_the_start_and_reads_until_the_job_ends(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.jobs[7] = {"job_id": 7, "state": "PENDING"}
    fake_api.outputs[(7, "stdout")] = [
        (None, False),  # not started: 404, the job is pending, so it waits
        ("", True),
        ("step 1\n", True),
        ("step 1\n", True),  # quiet for a while
        ("step 1\nstep 2\ndone\n", False),
    ]
    assert spur.main(["output", "-f", "7"]) == 0
    assert capsys.readouterr().out == "step 1\nstep 2\ndone\n"
    # Without -f, what there is now, once.
    fake_api.outputs[(7, "stdout")] = [("a\n", True), ("a\nb\n", True)]
    assert spur.main(["output", "7"]) == 0
    assert capsys.readouterr().out == "a\n"


def test_a_job_without_output_is_an_error_with_the_servers_message(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spur.main(["output", "8"]) == 1  # no such job
    assert capsys.readouterr().err == "spur output: error: job 8 has no output\n"
    fake_api.jobs[9] = {"job_id": 9, "state": "FAILED"}
    fake_api.outputs[(9, "stdout")] = [(None, False)]
    assert spur.main(["output", "-f", "9"]) == 1  # ended without output: no waiting
    assert capsys.readouterr().err == "spur output: error: job 9 has not started\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "spur output: error: name one job"),
        (["1", "2"], "spur output: error: name one job"),
        (["x"], "spur output: error: Invalid job id: x"),
        (["0"], "spur output: error: Invalid job id: 0"),
        (["99999999999999999999"], "spur output: error: Invalid job id"),
        (["--tail", "1"], "spur output: error: unrecognized option '--tail'"),
    ],
)
def test_bad_command_lines_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_args(argv)
    assert str(caught.value).startswith(message)
    assert caught.value.exit_code == 1


def test_help_needs_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert output.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("Usage: spur output")
