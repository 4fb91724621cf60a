"""The switch tree and blocks from config, and how they group a gang's candidates."""

from __future__ import annotations

import pytest

from scheduler.core.errors import InvalidSpec
from scheduler.core.topology import Topology

TREE = {
    "switches": {
        "leaf1": {"nodes": "gpu[01-02]"},
        "leaf2": {"nodes": "gpu[03-05]"},
        "spine": {"switches": "leaf[1-2]"},
    }
}


def test_a_node_hangs_on_its_leaf_and_a_set_meets_at_its_lowest_common_switch() -> None:
    topo = Topology.from_config(TREE)
    assert topo.leaf_of("gpu04") == "leaf2"
    assert topo.leaf_of("cpu01") is None
    assert topo.lowest_common_switch(["gpu03", "gpu05"]) == "leaf2"
    assert topo.lowest_common_switch(["gpu01", "gpu05"]) == "spine"
    assert topo.switches["spine"].level == 1


def test_candidates_group_under_the_lowest_switch_that_holds_the_gang() -> None:
    topo = Topology.from_config(TREE)
    groups = topo.groups(["gpu01", "gpu02", "gpu03", "gpu04"], 2)
    assert groups[0] == ["gpu01", "gpu02"]  # tightest leaf first, then the other leaf
    assert groups[-1][:3] == ["gpu01", "gpu02", "gpu03"]  # the spine, fullest leaf first
    assert topo.groups(["gpu01", "gpu03"], 3) == []


def test_a_gang_takes_one_block_when_it_can_and_the_fewest_blocks_otherwise() -> None:
    topo = Topology.from_config(
        {"block_size": 4, "blocks": {"b1": "gpu[01-04]", "b2": "gpu[05-08]"}}
    )
    cands = ["gpu01", "gpu05", "gpu06", "gpu07"]
    assert topo.groups(cands, 2) == [["gpu05", "gpu06", "gpu07"]]
    assert topo.groups(cands, 4)[0][:3] == ["gpu05", "gpu06", "gpu07"]
    assert topo.block_of("gpu03") == "b1"


@pytest.mark.parametrize(
    "config",
    [
        {"switches": {"s": {"nodes": "gpu[01-"}}},
        {"switches": {"s": {"switches": "nope"}}},
        {"switches": {"a": {"switches": "b"}, "b": {"switches": "a"}}},
        {"blocks": {"b1": "n[1-2]", "b2": "n[2-3]"}},
        {"block_size": 1, "blocks": {"b1": "n[1-2]"}},
        {"racks": {}},
    ],
)
def test_a_malformed_topology_is_refused(config: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec):
        Topology.from_config(config)
