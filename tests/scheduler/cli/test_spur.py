"""`spur`: the umbrella command."""

from __future__ import annotations

import pytest

from scheduler.cli import spur
from tests.scheduler.cli.fake_api import FakeApi


def test_it_dispatches_to_the_slurm_commands(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spur.main(["sbatch", "--parsable", "--wrap", "true"]) == 0
    assert capsys.readouterr().out == "100\n"
    assert spur.main(["squeue", "-h"]) == 0
    assert capsys.readouterr().out == ""


def test_config_prints_the_resolved_api_url(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spur.main(["config"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{fake_api.url}\n"
    assert err == "# from SPUR_API_URL\n"


def test_an_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert spur.main(["srun"]) == 2
    assert capsys.readouterr().err.startswith("spur: error: unknown command 'srun'")
    assert spur.main([]) == 2


def test_every_command_has_a_main() -> None:
    assert set(spur.COMMANDS) == {"sbatch", "squeue", "scancel", "sinfo", "sacct"}
