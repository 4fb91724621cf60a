"""Placement table tests: where a job lands, and why there rather than the first fit."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import NodeAlloc
from scheduler.core.placement import place, shape_of, unsatisfiable
from scheduler.core.resources import GpuDevice, NodeSpec
from scheduler.core.state import ClusterState
from scheduler.core.topology import Topology
from tests.scheduler.core.factories import cluster, gpu_node, spec, submit


def pcie_box(name: str = "box") -> NodeSpec:
    """8 GPUs behind two PCIe switches (0-3 and 4-7), one socket."""

    def link(a: int, b: int) -> str:
        return "pcie-switch" if a // 4 == b // 4 else "sys"

    gpus = tuple(
        GpuDevice(
            index=i,
            vendor="nvidia",
            model="l40s",
            memory_mb=49152,
            links=tuple((p, link(i, p)) for p in range(8) if p != i),
        )
        for i in range(8)
    )
    return NodeSpec(name=name, cpus=32, memory_mb=262144, agent_url="http://x", gpus=gpus)


def partitioned_node(name: str = "cpx") -> NodeSpec:
    """One physical GPU (0) with two CPX partitions (1, 2)."""
    parent = GpuDevice(index=0, vendor="amd", model="mi300x", memory_mb=196608)
    children = tuple(
        GpuDevice(index=i, vendor="amd", model="mi300x", memory_mb=98304, parent=0, profile="cpx")
        for i in (1, 2)
    )
    return NodeSpec(
        name=name, cpus=16, memory_mb=65536, agent_url="http://x", gpus=(parent, *children)
    )


def placed(state: ClusterState, free: FreeMap, **kw: Any) -> tuple[tuple[str, NodeAlloc], ...]:
    job = state.jobs[submit(state, **kw)]
    got = place(state, job, free)
    assert got is not None, f"{kw} did not fit"
    free.take(got)
    return got


def hold(free: FreeMap, node: str, gpus: tuple[int, ...], milli: tuple[int, ...] = ()) -> None:
    free.take([(node, NodeAlloc(gpus=gpus, cpus=1, mem_mb=1, gpu_milli=milli))])


def test_a_two_gpu_job_on_a_pcie_box_lands_behind_one_switch() -> None:
    state = cluster(pcie_box())
    free = FreeMap.of(state)
    hold(free, "box", (0, 1, 2))  # first fit would now take 3 and 4, across the switches
    ((_, alloc),) = placed(state, free, gpus_per_node=2)
    assert {g // 4 for g in alloc.gpus} == {1}


def test_a_four_gpu_job_on_a_two_socket_node_stays_in_one_numa_domain_with_its_cpus() -> None:
    node = gpu_node("n1", cpus=64)
    state = cluster(node)
    free = FreeMap.of(state)
    hold(free, "n1", (0,))  # first fit would take 1-4, across the sockets
    ((_, alloc),) = placed(state, free, gpus_per_node=4, cpus_per_task=8)
    assert alloc.gpus == (4, 5, 6, 7)
    assert len(alloc.cpu_ids) == 8 and set(alloc.cpu_ids) <= set(node.numa_cpus[1])


def test_a_sixteen_gpu_job_on_a_two_level_tree_lands_under_one_leaf() -> None:
    state = cluster(*(gpu_node(f"gpu0{i}") for i in range(1, 5)))
    tree = Topology.from_config(
        {
            "switches": {
                "leaf1": {"nodes": "gpu[01-02]"},
                "leaf2": {"nodes": "gpu[03-04]"},
                "spine": {"switches": "leaf[1-2]"},
            }
        }
    )
    free = FreeMap.of(state)
    hold(free, "gpu01", (0,))  # first fit would pair gpu02 with gpu03, across the spine
    job = state.jobs[submit(state, nodes=2, gpus_per_node=8)]
    got = place(state, job, free, topology=tree)
    assert got is not None
    assert [name for name, _ in got] == ["gpu03", "gpu04"]


def test_fractional_jobs_pack_onto_shared_gpus_before_breaking_a_whole_one() -> None:
    state = cluster(gpu_node("n1"))
    free = FreeMap.of(state)
    ((_, a),) = placed(state, free, gpu_milli=300)
    ((_, b),) = placed(state, free, gpu_milli=500)
    assert b.gpus == a.gpus and b.gpu_milli == (500,)
    ((_, c),) = placed(state, free, gpu_milli=400)  # 200 left on the shared one
    assert c.gpus != a.gpus
    ((_, d),) = placed(state, free, gpu_milli=150)  # the smallest leftover that holds it
    assert d.gpus == a.gpus
    assert free.nodes[0].used[a.gpus[0]] == 950
    assert sum(1 for u in free.nodes[0].used if u) == 2


def test_shares_on_one_gpu_never_sum_past_a_thousand() -> None:
    state = cluster(gpu_node("n1", gpus=1))
    free = FreeMap.of(state)
    placed(state, free, gpu_milli=600)
    assert place(state, state.jobs[submit(state, gpu_milli=500)], free) is None
    with pytest.raises(ValueError):
        hold(free, "n1", (0,), (500,))
    node = state.nodes["n1"]
    node.take(99, NodeAlloc(gpus=(0,), cpus=1, mem_mb=1, gpu_milli=(600,)))
    assert not node.fits(NodeAlloc(gpus=(0,), cpus=1, mem_mb=1, gpu_milli=(401,)))
    assert node.fits(NodeAlloc(gpus=(0,), cpus=1, mem_mb=1, gpu_milli=(400,)))


def test_a_job_on_the_parent_gpu_makes_its_partitions_unavailable() -> None:
    state = cluster(partitioned_node())
    free = FreeMap.of(state)
    ((_, alloc),) = placed(state, free, gpus_per_node=1)
    assert alloc.gpus == (0,)
    assert place(state, state.jobs[submit(state, gpus_per_node=1, gpu_type="cpx")], free) is None


def test_a_job_on_a_partition_makes_its_parent_unavailable() -> None:
    state = cluster(partitioned_node())
    free = FreeMap.of(state)
    ((_, alloc),) = placed(state, free, gpus_per_node=1, gpu_type="cpx")
    assert alloc.gpus in ((1,), (2,))
    assert place(state, state.jobs[submit(state, gpus_per_node=1)], free) is None
    ((_, other),) = placed(state, free, gpus_per_node=1, gpu_type="cpx")
    assert {alloc.gpus[0], other.gpus[0]} == {1, 2}
    node = state.nodes["cpx"]
    node.take(7, alloc)
    assert not node.fits(NodeAlloc(gpus=(0,), cpus=1, mem_mb=1))


def test_best_fit_keeps_an_eight_gpu_node_free_for_an_eight_gpu_job() -> None:
    state = cluster(gpu_node("a"), gpu_node("b"))
    free = FreeMap.of(state)
    hold(free, "b", (0, 1, 2, 3))  # first fit would put the next job on a
    ((name, _),) = placed(state, free, gpus_per_node=1)
    assert name == "b"
    ((name, _),) = placed(state, free, gpus_per_node=8)
    assert name == "a"


def featured(name: str, *features: str) -> NodeSpec:
    base = gpu_node(name)
    return NodeSpec(
        name=base.name,
        cpus=base.cpus,
        memory_mb=base.memory_mb,
        agent_url=base.agent_url,
        gpus=base.gpus,
        features=features,
    )


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"constraint": "ib"}, "b"),
        ({"constraint": "ib&nvme"}, "c"),
        ({"constraint": "nvme|ib"}, "b"),
        ({"constraint": "mi300x"}, "a"),  # GPU models are features too
        ({"nodelist": ("c",)}, "c"),
        ({"exclude": ("a", "b")}, "c"),
    ],
)
def test_constraint_nodelist_and_exclude_choose_the_node(
    request_: dict[str, Any], expected: str
) -> None:
    state = cluster(featured("a"), featured("b", "ib"), featured("c", "ib", "nvme"))
    free = FreeMap.of(state)
    ((name, _),) = placed(state, free, gpus_per_node=1, **request_)
    assert name == expected


def test_an_exclusive_job_takes_a_whole_idle_node() -> None:
    state = cluster(gpu_node("a"), gpu_node("b"))
    free = FreeMap.of(state)
    hold(free, "a", (0,))
    ((name, alloc),) = placed(state, free, gpus_per_node=1, exclusive=True)
    assert name == "b" and alloc.cpus == 64 and alloc.mem_mb == 524288
    assert place(state, state.jobs[submit(state, gpus_per_node=1)], free) is not None
    job = state.jobs[submit(state, gpus_per_node=1, exclusive=True)]
    assert place(state, job, free) is None


def test_shards_convert_to_a_share_of_one_gpu() -> None:
    state = cluster(gpu_node("n1"))
    free = FreeMap.of(state)
    ((_, alloc),) = placed(state, free, shards=2)
    assert alloc.gpu_milli == (250,)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"gpus_per_node": 9}, "9 GPUs per node requested, the largest node has 8"),
        ({"gpus_per_node": 1, "gpu_type": "h100"}, "unknown GPU type 'h100'"),
        ({"cpus_per_task": 65}, "65 CPUs per node requested"),
        ({"mem_per_node_mb": 10**7}, "memory per node requested"),
        ({"nodes": 3}, "3 nodes requested"),
        ({"constraint": "ib"}, "no node of partition gpu has ib"),
        ({"gpu_milli": 500}, None),
    ],
)
def test_a_request_no_node_could_ever_hold_is_refused_with_its_reason(
    request_: dict[str, Any], message: str | None
) -> None:
    state = cluster(gpu_node("a"), gpu_node("b"))
    got = unsatisfiable(state, shape_of(state, spec(**request_), "gpu"))
    if message is None:
        assert got is None
    else:
        assert got is not None and message in got
