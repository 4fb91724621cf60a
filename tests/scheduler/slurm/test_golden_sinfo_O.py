"""sinfo -O against Slurm 22.05: the golden files have no `sinfo -O` capture, so each -O
layout is checked against the `-o` capture that names the same fields with the same
widths (`Name:.W` is `%.W<letter>`), and against squeue -O's 20-column default."""

from __future__ import annotations

import pytest

from scheduler.cli.console import UsageError
from scheduler.cli.sinfo import parse_args
from scheduler.slurm.sinfo_format import format_sinfo, parse_format, parse_long_format
from tests.scheduler.slurm.golden import capture
from tests.scheduler.slurm.scene import nodes, partitions


def test_O_with_the_default_formats_widths_prints_what_slurms_default_does() -> None:
    # The default `%#P %.5a %.10l %.6D %.6t %N`, spelt with -O (a space is a suffix).
    fields = "Partition:9 ,Available:.5 ,Time:.10 ,Nodes:.6 ,StateCompact:.6 ,NodeList:0"
    out = format_sinfo(nodes(), partitions(), parse_long_format(fields))
    golden = capture("01_sinfo_idle_default.txt", "sinfo").stdout.splitlines()
    assert out == golden


def test_O_without_widths_gives_twenty_column_left_justified_fields() -> None:
    out = format_sinfo(
        nodes("mix", 1), partitions(), parse_long_format("partition,nodes,statelong")
    )
    assert out == [
        "PARTITION           NODES               STATE               ",
        "gpu*                4                   mixed               ",
    ]


def test_O_and_o_agree_field_for_field() -> None:
    golden = capture("27_sinfo_busy.txt", "sinfo -N -o '%N %t %G %C %m %e'").stdout.splitlines()
    long = parse_long_format("NodeList:0 ,StateCompact:0 ,Gres:0 ,CPUsState:0 ,Memory:0 ,FreeMem:0")
    out = format_sinfo(nodes("mix", 1), partitions(), long, node_oriented=True)
    ours = format_sinfo(nodes("mix", 1), partitions(), parse_format("%N %t %G %C %m %e"),
                        node_oriented=True)  # fmt: skip
    assert out == ours
    # Spur reports no free memory (N/A), the rest is Slurm's.
    assert [line.rsplit(" ", 1)[0] for line in out] == [g.rsplit(" ", 1)[0] for g in golden]


def test_an_unknown_O_field_is_refused_with_slurms_message() -> None:
    with pytest.raises(UsageError, match="Invalid node format specification: Colour"):
        parse_args(["-O", "Partition,Colour"], {})


def test_O_is_taken_on_the_command_line() -> None:
    args = parse_args(["-O", "NodeList:.12"], {})
    assert [(p.key, p.width, p.right) for p in args.pieces] == [("N", 12, True)]
