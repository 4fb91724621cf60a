"""FreeMap copies share node views until one side writes (copy on write)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import NodeAlloc
from tests.scheduler.core.factories import gpu_node


def free_gpus(free: FreeMap) -> dict[str, list[int]]:
    return {
        view.name: [d for d in range(len(view.used)) if view.free_milli(d) == 1000]
        for view in free.nodes
    }


def test_a_copy_and_its_source_change_independently():
    source = FreeMap.of_specs([gpu_node("a"), gpu_node("b")])
    before = free_gpus(source)
    copy = source.copy()
    copy.take((("a", NodeAlloc(gpus=(0, 1), cpus=2, mem_mb=10)),))
    assert free_gpus(source) == before
    source.take((("b", NodeAlloc(gpus=(7,), cpus=1, mem_mb=10)),))
    assert free_gpus(copy)["b"] == list(range(8))
    assert free_gpus(copy)["a"] == list(range(2, 8))
    assert free_gpus(source)["a"] == list(range(8))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from("ab"), st.integers(0, 7)), max_size=20))
def test_copies_of_copies_never_leak_writes(steps):
    maps = [FreeMap.of_specs([gpu_node("a", gpus=8), gpu_node("b", gpus=8)])]
    expected = [free_gpus(maps[0])]
    for fork, node, gpu in steps:
        if fork:
            maps.append(maps[-1].copy())
            expected.append({k: list(v) for k, v in expected[-1].items()})
        alloc = ((node, NodeAlloc(gpus=(gpu,), cpus=1, mem_mb=1)),)
        if maps[-1].can_take(alloc):
            maps[-1].take(alloc)
            expected[-1][node].remove(gpu)
        for m, e in zip(maps, expected, strict=True):
            assert free_gpus(m) == e
