"""Property: any sequence of takes and gives on a FreeMap stays within capacity, and
giving everything back restores the map it started from."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import NodeAlloc
from scheduler.core.nodes import MILLI
from scheduler.core.resources import GpuDevice, NodeSpec
from tests.scheduler.core.factories import gpu_node


def _nodes() -> list[NodeSpec]:
    parent = GpuDevice(index=0, vendor="amd", model="mi300x", memory_mb=1)
    kids = tuple(
        GpuDevice(index=i, vendor="amd", model="mi300x", memory_mb=1, parent=0, profile="cpx")
        for i in (1, 2)
    )
    return [
        gpu_node("a", gpus=4, cpus=8, memory_mb=64),
        NodeSpec(name="b", cpus=4, memory_mb=32, agent_url="x", gpus=(parent, *kids)),
    ]


def _state(free: FreeMap) -> list[tuple[list[int], list[int], int, int, list[list[int]]]]:
    return [(list(n.used), list(n.blocked), n.cpus, n.mem_mb, n.cpu_ids) for n in free.nodes]


requests = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.lists(st.integers(0, 3), min_size=0, max_size=3, unique=True),
        st.integers(1, 1000),
        st.integers(0, 3),
        st.integers(0, 20),
        st.booleans(),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(requests)
def test_takes_never_exceed_capacity_and_gives_restore_the_map(ops: list) -> None:  # type: ignore[type-arg]
    specs = {s.name: s for s in _nodes()}
    free = FreeMap.of_specs(list(specs.values()))
    start = _state(free)
    held: list[tuple[str, NodeAlloc]] = []
    for name, gpus, milli, cpus, mem, bind in ops:
        devices = tuple(g for g in gpus if g < len(specs[name].gpus))
        first_cpus = tuple(free.node(name).cpu_ids[0][:cpus]) if bind else ()  # type: ignore[union-attr]
        alloc = NodeAlloc(
            gpus=devices,
            cpus=len(first_cpus) if bind else cpus,
            mem_mb=mem,
            gpu_milli=tuple(milli for _ in devices),
            cpu_ids=first_cpus,
        )
        if free.can_take([(name, alloc)]):
            free.take([(name, alloc)])
            held.append((name, alloc))
        for view in free.nodes:
            assert all(0 <= u <= MILLI for u in view.used)
            assert view.cpus >= 0 and view.mem_mb >= 0
            for d, used in enumerate(view.used):
                if used:
                    assert not any(view.used[r] for r in view.shape.related[d])
    for entry in reversed(held):
        free.give([entry])
    assert _state(free) == start
    assert free.whole == FreeMap.of_specs(list(specs.values())).whole
