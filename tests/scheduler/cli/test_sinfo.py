"""`sinfo`: options and the command against a web API on loopback."""

from __future__ import annotations

import pytest

from scheduler.cli import sinfo
from scheduler.cli.sinfo import UsageError, parse_args
from scheduler.slurm import sinfo_format
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.golden import capture, compares
from tests.scheduler.slurm.scene import nodes, partitions


def test_the_layout_follows_n_and_l() -> None:
    def fmt(argv: list[str]) -> list[object]:
        return parse_args(argv, {}).pieces  # type: ignore[return-value]

    assert fmt([]) == sinfo_format.parse_format(sinfo_format.DEFAULT_FORMAT)
    assert fmt(["-N", "-l"]) == sinfo_format.parse_format(sinfo_format.NODE_LONG_FORMAT)
    assert fmt(["-l"]) == sinfo_format.parse_format(sinfo_format.LONG_FORMAT)
    assert fmt(["-N"]) == sinfo_format.parse_format(sinfo_format.NODE_FORMAT)
    assert fmt(["-o", "%N"]) == sinfo_format.parse_format("%N")
    assert parse_args([], {"SINFO_FORMAT": "%P"}).pieces == sinfo_format.parse_format("%P")


def test_filters_are_parsed() -> None:
    args = parse_args(["-t", "idle,ALLOCATED", "-p", "gpu", "-n", "gpu[01-02]", "-h"], {})
    assert args.states == frozenset({"idle", "alloc"})
    assert args.partitions == frozenset({"gpu"})
    assert args.nodes == frozenset({"gpu01", "gpu02"})
    assert args.header is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-t", "sleepy"], "Invalid node state specified: sleepy"),
        (["-o", "%y"], "Invalid format"),
        (["--bogus"], "unrecognized option '--bogus'"),
        (["-n", "gpu[01-"], "invalid hostlist"),
    ],
)
def test_bad_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(argv, {})


@compares(
    ("01_sinfo_idle_default.txt", "sinfo"),
    ("01_sinfo_idle_default.txt", "sinfo -o '%P %a %l %D %t %N'"),
)
def test_the_command_prints_partitions_like_slurm(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.nodes = nodes()
    fake_api.partitions = partitions()
    assert sinfo.main([]) == 0
    assert capsys.readouterr().out == capture("01_sinfo_idle_default.txt", "sinfo").stdout
    assert sinfo.main(["-o", "%P %a %l %D %t %N"]) == 0
    expected = capture("01_sinfo_idle_default.txt", "sinfo -o '%P %a %l %D %t %N'").stdout
    assert capsys.readouterr().out == expected
