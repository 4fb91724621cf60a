"""Hostlists, in the order Slurm keeps them."""

from __future__ import annotations

import pytest

from scheduler.slurm.hostlist import compress, expand


def test_it_expands_ranges_keeping_the_width_of_the_low_bound() -> None:
    assert expand("node[01-04,07]") == ["node01", "node02", "node03", "node04", "node07"]
    assert expand("n[8-10]") == ["n8", "n9", "n10"]


def test_products_vary_the_rightmost_range_fastest() -> None:
    assert expand("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]


def test_expansion_keeps_the_given_order() -> None:
    assert expand("b,a,n[3,1]") == ["b", "a", "n3", "n1"]
    assert expand("") == []


def test_compression_merges_runs() -> None:
    assert compress(["n01", "n02", "n10"]) == "n[01-02,10]"
    assert compress(["gpu01", "gpu02", "gpu03", "gpu04"]) == "gpu[01-04]"
    assert compress(["gpu03"]) == "gpu03"
    assert compress([]) == ""


def test_compression_never_reorders_names() -> None:
    out = compress(["gpu03", "gpu04", "gpu01"])
    assert expand(out) == ["gpu03", "gpu04", "gpu01"]
    assert out == "gpu[03-04],gpu01"


def test_compression_round_trips_mixed_prefixes_and_duplicates() -> None:
    names = ["a1", "b1", "a2", "a2"]
    assert expand(compress(names)) == names


def test_a_malformed_hostlist_is_an_error() -> None:
    with pytest.raises(ValueError, match="invalid hostlist"):
        expand("n[1-")
