"""Node bookkeeping: milli-GPU shares, partitions, CPU binding, the dict the web shows."""

from __future__ import annotations

import pickle

import pytest

from scheduler.core.errors import InvalidSpec
from scheduler.core.jobs import NodeAlloc
from scheduler.core.nodes import Node
from scheduler.core.resources import GpuDevice, NodeSpec
from tests.scheduler.core.factories import gpu_node


def test_shared_gpus_count_as_in_use_and_report_their_milli() -> None:
    node = Node(spec=gpu_node("n1", gpus=2))
    node.take(1, NodeAlloc(gpus=(1,), cpus=1, mem_mb=10, gpu_milli=(300,), cpu_ids=(40,)))
    node.take(2, NodeAlloc(gpus=(1,), cpus=1, mem_mb=10, gpu_milli=(200,)))
    out = node.to_dict()
    assert out["gpus_in_use"] == [1] and out["gpus_alloc"] == 1
    assert out["gpu_milli_used"] == [0, 500]
    assert node.free_gpus() == [0]
    assert node.gpu_milli_free(1) == 500
    assert not node.fits(NodeAlloc(gpus=(0,), cpus=1, mem_mb=1, cpu_ids=(40,)))
    node.check(
        {
            1: NodeAlloc(gpus=(1,), cpus=1, mem_mb=10, gpu_milli=(300,), cpu_ids=(40,)),
            2: NodeAlloc(gpus=(1,), cpus=1, mem_mb=10, gpu_milli=(200,)),
        }
    )
    node.give_back(1, NodeAlloc(gpus=(1,), cpus=1, mem_mb=10, gpu_milli=(300,), cpu_ids=(40,)))
    assert node.gpu_milli_used == [0, 200] and node.cpu_owner == {}


def test_a_node_survives_a_snapshot_round_trip() -> None:
    node = Node(spec=gpu_node("n1", gpus=2))
    node.take(1, NodeAlloc(gpus=(0,), cpus=1, mem_mb=10))
    back = pickle.loads(pickle.dumps(node))
    assert back.gpu_shares == node.gpu_shares
    assert back.gpu_milli_free(0) == 0


def test_numa_cpus_default_to_an_even_split_over_the_gpus_numa_nodes() -> None:
    spec = gpu_node("n1", cpus=64)
    assert spec.numa_cpus == (tuple(range(32)), tuple(range(32, 64)))
    assert NodeSpec.from_dict(spec.to_dict()) == spec


def test_partitions_round_trip_and_old_dicts_still_parse() -> None:
    parent = GpuDevice(index=0, vendor="nvidia", model="h100", memory_mb=81920)
    child = GpuDevice(
        index=1, vendor="nvidia", model="h100", memory_mb=10240, parent=0, profile="mig-1g.10gb"
    )
    spec = NodeSpec(name="n1", cpus=8, memory_mb=1024, agent_url="x", gpus=(parent, child))
    assert NodeSpec.from_dict(spec.to_dict()) == spec
    assert "parent" not in parent.to_dict()
    old = spec.to_dict()
    del old["numa_cpus"]
    old["gpus"] = [parent.to_dict()]
    assert NodeSpec.from_dict(old).gpus == (parent,)


@pytest.mark.parametrize(
    "bad",
    [
        {"numa_cpus": [[0, 1], [1]]},
        {"numa_cpus": [[0, 99]]},
        {"gpus": [{"index": 0, "vendor": "amd", "model": "x", "memory_mb": 1, "parent": 0}]},
        {
            "gpus": [{"index": 0, "vendor": "amd", "model": "x", "memory_mb": 1, "numa": 3}],
            "numa_cpus": [[0, 1, 2, 3], [4, 5, 6, 7]],
        },
    ],
)
def test_a_malformed_node_is_refused(bad: dict[str, object]) -> None:
    data = {"name": "n1", "cpus": 8, "memory_mb": 1024, "agent_url": "x", **bad}
    with pytest.raises(InvalidSpec):
        NodeSpec.from_dict(data)


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "n" * 64},
        {"name": "nöde"},
        {"cpus": 1 << 17},
        {"memory_mb": 1 << 33},
        {"agent_url": "http://x/\n"},
        {"features": tuple(f"f{i}" for i in range(300))},
    ],
)
def test_a_node_description_out_of_bounds_is_refused(changes: dict[str, object]) -> None:
    fields = {**vars(gpu_node("n1")), **changes}
    with pytest.raises(InvalidSpec):
        NodeSpec(**fields)  # type: ignore[arg-type]
