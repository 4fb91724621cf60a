"""`sbatch` end to end against a web API on loopback."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import sbatch
from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.golden import capture, compares


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = sbatch.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_it_submits_and_prints_the_job_id(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--gres=gpu:1", "--wrap", "sleep 2")
    assert (code, out, err) == (0, "Submitted batch job 100\n", "")
    method, path, _, body = fake_api.requests[0]
    assert (method, path) == ("POST", "/api/v1/jobs")
    assert body["gpus_per_node"] == 1 and body["name"] == "wrap"
    assert "tenant" not in body and "user" not in body


def test_parsable_prints_only_the_id(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--parsable", "-J", "named", "--wrap", "true") == (0, "100\n", "")


def test_a_refused_submission_prints_slurms_error(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = capture("13_sbatch_unsatisfiable_gres.txt", "sbatch --gres=gpu:9 --wrap true")
    fake_api.refuse_submit = "Requested node configuration is not available"
    assert run(capsys, "--gres=gpu:9", "--wrap", "true") == (1, golden.stdout, golden.stderr)


def test_a_submission_refused_for_credit_prints_the_apis_message_and_fails(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    message = "Payment required: your organisation's prepaid credit is used up (balance 0.00 USD)."
    fake_api.refuse_submit, fake_api.refuse_submit_status = message, 402
    code, out, err = run(capsys, "--wrap", "true")
    assert (code, out) == (1, "")
    assert err == f"sbatch: error: Batch job submission failed: {message}\n"


def test_a_script_file_and_its_directives_are_sent(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH -J train -t 1:00:00\n#SBATCH --mail-type=END\necho\n")
    code, out, err = run(capsys, str(script), "epochs=3")
    assert code == 0 and out == "Submitted batch job 100\n"
    assert err == "sbatch: warning: --mail-type is not supported yet; ignored\n"
    body = fake_api.requests[0][3]
    assert (body["name"], body["time_limit_min"], body["argv"]) == ("train", 60, ["epochs=3"])


@compares(("12_sbatch_invalid_option.txt", "sbatch --bogus-option --wrap true"))
def test_bad_options_fail_before_reaching_the_server(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = capture("12_sbatch_invalid_option.txt", "sbatch --bogus-option --wrap true")
    assert run(capsys, "--bogus-option", "--wrap", "true") == (255, "", golden.stderr)
    assert fake_api.requests == []


def test_a_script_on_stdin_is_read(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("echo no shebang\n"))
    code, out, err = run(capsys)
    assert code == 1 and out == ""
    assert err.startswith("sbatch: error: This does not look like a batch script.")


def test_a_wrong_token_is_reported(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPUR_TOKEN", "spur_wrong")
    code, _, err = run(capsys, "--wrap", "true")
    assert code == 1 and err.startswith("sbatch: error: authentication failed")


def test_no_configuration_is_reported(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("SPUR_API_URL", "SPUR_TOKEN", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = run(capsys, "--wrap", "true")
    assert code == 1 and err.startswith("sbatch: error: no Spur API configured: set SPUR_API_URL")


def test_wait_polls_until_the_job_ends_and_exits_with_its_code(fake_api: FakeApi) -> None:
    fake_api.jobs[7] = {"job_id": 7, "state": "RUNNING"}
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            fake_api.jobs[7] = {"job_id": 7, "state": "FAILED", "exit_code": 3, "signal": None}

    client = ApiClient(CliConfig(api_url=fake_api.url, token=fake_api.token))
    assert sbatch.wait_for_job(client, 7, sleep=nap) == 3
    assert naps == [2.0, 4.0, 8.0]


@pytest.mark.parametrize(
    ("job", "status"),
    [
        ({"state": "COMPLETED", "exit_code": 0}, 0),
        ({"state": "FAILED", "exit_code": 3}, 3),
        ({"state": "CANCELLED", "exit_code": 0, "signal": 15}, 1),
        ({"state": "TIMEOUT", "exit_code": None}, 1),
        ({"state": "NODE_FAIL", "exit_code": 0}, 1),
    ],
)
def test_wait_exit_status_follows_the_job(job: dict[str, Any], status: int) -> None:
    assert sbatch.job_exit_status(job) == status


def test_wait_gives_up_when_the_job_disappears(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    client = ApiClient(CliConfig(api_url=fake_api.url, token=fake_api.token))
    assert sbatch.wait_for_job(client, 999, sleep=lambda s: None) == 1
    assert "Job 999 no longer exists" in capsys.readouterr().err


def test_version_needs_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--version") == (0, "slurm 22.05.8\n", "")


@pytest.mark.parametrize(
    ("argv", "message", "code", "stderr"),
    [
        (
            ["-A", "nosuch"],
            "Invalid account or account/partition combination specified: nosuch",
            "invalid_account",
            "sbatch: error: Batch job submission failed: "
            "Invalid account or account/partition combination specified\n",
        ),
        (
            ["-q", "gold"],
            "Invalid qos specification: gold",
            "invalid_qos",
            "sbatch: error: Batch job submission failed: Invalid qos specification\n",
        ),
        (
            ["--dependency=afterok:99"],
            "Job dependency problem: job 99 does not exist",
            "invalid_dependency",
            "sbatch: error: Batch job submission failed: Job dependency problem\n",
        ),
        (
            # Never runnable: Slurm's sentence, then why (SLURM.md, "Where we choose to differ").
            ["--gres=gpu:9"],
            "Requested node configuration is not available: "
            "9 GPUs per node requested, the largest node has 8",
            "unsatisfiable",
            "sbatch: error: Batch job submission failed: "
            "Requested node configuration is not available\n"
            "sbatch: error: 9 GPUs per node requested, the largest node has 8\n",
        ),
        (
            # Not one of Slurm's refusals: said whole.
            ["-p", "gpu"],
            "Job's account not permitted to use this partition (gpu allows ml; not acme)",
            "account_not_allowed",
            "sbatch: error: Batch job submission failed: "
            "Job's account not permitted to use this partition (gpu allows ml; not acme)\n",
        ),
    ],
)
def test_a_refusal_is_told_in_slurms_sentence(
    fake_api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
    code: str,
    stderr: str,
) -> None:
    fake_api.refuse_submit, fake_api.refuse_submit_code = message, code
    assert run(capsys, *argv, "--wrap", "true") == (1, "", stderr)


@compares(("12_sbatch_invalid_option.txt", "sbatch -p nosuchpart --wrap true"))
def test_an_unknown_partition_is_named_first_as_slurm_names_it(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = capture("12_sbatch_invalid_option.txt", "sbatch -p nosuchpart --wrap true")
    fake_api.refuse_submit = "Invalid partition name specified"  # the controller's words
    fake_api.refuse_submit_code = "invalid_partition"
    result = run(capsys, "-p", "nosuchpart", "--wrap", "true")
    assert result == (golden.exit_code, golden.stdout, golden.stderr)


def test_verbose_says_what_was_wrong_after_slurms_sentence(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.refuse_submit = "Invalid qos specification: gold"
    fake_api.refuse_submit_code = "invalid_qos"
    assert run(capsys, "-v", "-q", "gold", "--wrap", "true") == (
        1,
        "",
        "sbatch: error: Batch job submission failed: Invalid qos specification\n"
        "sbatch: error: Invalid qos specification: gold\n",
    )
