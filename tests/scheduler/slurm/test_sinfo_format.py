"""sinfo's rows and columns against Slurm 22.05's (golden files 01 and 27)."""

from __future__ import annotations

from scheduler.slurm.sinfo_format import (
    DEFAULT_FORMAT,
    NODE_LONG_FORMAT,
    format_sinfo,
    node_state,
    parse_format,
)
from tests.scheduler.slurm.golden import capture, compares, differs
from tests.scheduler.slurm.scene import NOW, node, nodes, partitions


def lines(text: str) -> list[str]:
    return text.splitlines()


@compares(("01_sinfo_idle_default.txt", "sinfo"))
def test_the_default_format_on_an_idle_cluster_matches_slurm() -> None:
    expected = capture("01_sinfo_idle_default.txt", "sinfo").stdout
    out = format_sinfo(nodes(), partitions(), parse_format(DEFAULT_FORMAT))
    assert out == lines(expected)


@compares(("27_sinfo_busy.txt", "sinfo"))
def test_the_default_format_on_a_busy_cluster_matches_slurm() -> None:
    expected = capture("27_sinfo_busy.txt", "sinfo").stdout
    out = format_sinfo(nodes("mix", 1), partitions(), parse_format(DEFAULT_FORMAT))
    assert out == lines(expected)


@compares(("01_sinfo_idle_default.txt", "sinfo -N -l"))
def test_the_long_node_oriented_format_matches_slurm(utc: None) -> None:
    expected = capture("01_sinfo_idle_default.txt", "sinfo -N -l").stdout
    out = format_sinfo(
        nodes(),
        partitions(),
        parse_format(NODE_LONG_FORMAT),
        node_oriented=True,
        banner=NOW.replace(second=34),
    )
    assert out == lines(expected)


@compares(("27_sinfo_busy.txt", "sinfo -N -l"))
def test_the_long_node_oriented_format_spells_states_out(utc: None) -> None:
    expected = capture("27_sinfo_busy.txt", "sinfo -N -l").stdout
    out = format_sinfo(
        nodes("mix", 1),
        partitions(),
        parse_format(NODE_LONG_FORMAT),
        node_oriented=True,
        banner=NOW,
    )
    assert out == lines(expected)


@compares(("27_sinfo_busy.txt", "sinfo -o '%P %a %l %D %t %N'"))
def test_a_plain_format_matches_slurm() -> None:
    expected = capture("27_sinfo_busy.txt", "sinfo -o '%P %a %l %D %t %N'").stdout
    out = format_sinfo(nodes("mix", 1), partitions(), parse_format("%P %a %l %D %t %N"))
    assert out == lines(expected)


@differs(("27_sinfo_busy.txt", "sinfo -N -o '%N %t %G %C %m %e'"))
def test_gres_and_cpu_counts_per_node_match_slurm() -> None:
    golden = capture("27_sinfo_busy.txt", "sinfo -N -o '%N %t %G %C %m %e'").stdout
    out = format_sinfo(
        nodes("mix", 1), partitions(), parse_format("%N %t %G %C %m %e"), node_oriented=True
    )
    # FREE_MEM is the operating system's figure, which Spur does not report.
    assert [line.rsplit(" ", 1)[0] for line in out] == [g.rsplit(" ", 1)[0] for g in lines(golden)]
    assert {line.rsplit(" ", 1)[1] for line in out[1:]} == {"N/A"}
    assert "N/A" not in golden


def test_nodes_in_different_states_make_separate_rows() -> None:
    mixed = [node("gpu01", "alloc", 64), node("gpu02", "idle"), node("gpu03", "idle")]
    mixed.append(node("gpu04", "alloc", 64))
    out = format_sinfo(mixed, partitions(), parse_format(DEFAULT_FORMAT), header=False)
    assert out == [
        "gpu*         up   infinite      2  alloc gpu[01,04]",
        "gpu*         up   infinite      2   idle gpu[02-03]",
    ]


def test_cpu_totals_add_up_over_the_nodes_of_a_row() -> None:
    out = format_sinfo(nodes("mix", 8), partitions(), parse_format("%C %F"), header=False)
    assert out == ["32/224/0/256 4/0/0/4"]


def test_a_draining_node_with_jobs_reads_drng() -> None:
    assert node_state(node("gpu01", "drain", 4)) == "drng"
    assert node_state(node("gpu01", "drain", 0)) == "drain"


def test_filters_keep_only_the_asked_states_and_partitions() -> None:
    some = [node("gpu01", "alloc", 64), node("gpu02"), node("gpu03"), node("gpu04")]
    out = format_sinfo(
        some, partitions(), parse_format("%N"), header=False, states=frozenset({"idle"})
    )
    assert out == ["gpu[02-04]"]
    none = format_sinfo(
        some, partitions(), parse_format("%N"), header=False, partition_names=frozenset({"cpu"})
    )
    assert none == []


def test_a_partition_with_a_time_limit_and_no_nodes_still_gets_a_row() -> None:
    empty = [{"name": "debug", "default": False, "state": "up", "max_time_min": 90, "nodes": []}]
    out = format_sinfo([], empty, parse_format(DEFAULT_FORMAT))
    assert out[1] == "debug        up    1:30:00      0    n/a "


def test_an_unknown_letter_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError):
        parse_format("%P %y")
