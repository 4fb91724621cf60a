"""Fragmentation Gradient Descent: the measure by hand, and choices it makes better."""

from __future__ import annotations

import pytest

from scheduler.core.fragmentation import TaskMix, TaskShape
from scheduler.core.freemap import FreeMap, node_sig
from scheduler.core.jobs import NodeAlloc
from scheduler.core.placement import fragmentation, place, task_mix
from tests.scheduler.core.factories import cluster, gpu_node, submit


def hold(
    free: FreeMap, node: str, gpus: tuple[int, ...], milli: tuple[int, ...], cpus: int
) -> None:
    free.take([(node, NodeAlloc(gpus=gpus, cpus=cpus, mem_mb=1, gpu_milli=milli))])


def test_a_node_fragment_is_the_mix_weighted_capacity_each_shape_cannot_use() -> None:
    state = cluster(gpu_node("a", gpus=4, cpus=16))
    free = FreeMap.of(state)
    hold(free, "a", (2, 3), (500, 1000), cpus=1)  # free: 1000, 1000, 500, 0; 15 CPUs
    mix = TaskMix(
        [
            (TaskShape(2, 0, "", 1, 1), 0.5),  # fits; the 500 left on GPU 2 is lost to it
            (TaskShape(0, 600, "", 1, 1), 0.25),  # fits; GPU 2's 500 is too small
            (TaskShape(1, 0, "", 100, 1), 0.25),  # 100 CPUs: all 2500 free is lost
        ]
    )
    # 0.5 * 500 + 0.25 * 500 + 0.25 * 2500 = 1000 milli-GPUs
    assert fragmentation(state, free, mix) == pytest.approx(1.0)


def test_memory_short_of_a_shape_makes_all_free_gpu_capacity_a_fragment_for_it() -> None:
    state = cluster(gpu_node("a", gpus=2, memory_mb=1000))
    free = FreeMap.of(state)
    mix = TaskMix([(TaskShape(1, 0, "", 1, 2000), 1.0)])
    assert fragmentation(state, free, mix) == pytest.approx(2.0)


def test_shapes_without_gpus_carry_no_weight_and_weights_are_popularity() -> None:
    state = cluster(gpu_node("a"))
    jobs = [
        state.jobs[submit(state, gpus_per_node=1)],
        state.jobs[submit(state, gpus_per_node=1)],
        state.jobs[submit(state, gpu_milli=500)],
        state.jobs[submit(state, cpus_per_task=4)],
    ]
    mix = task_mix(jobs)
    weights = {(s.whole, s.milli): w for s, w in zip(mix.shapes, mix.weights, strict=True)}
    assert weights == {(1, 0): pytest.approx(2 / 3), (0, 500): pytest.approx(1 / 3)}


def test_a_cpu_only_job_avoids_the_node_whose_gpus_it_would_strand() -> None:
    # First fit puts it on "a" and takes every CPU there, leaving a's 2 GPUs usable by
    # no task of the mix; FGD sends it to "b", which keeps CPUs for its GPUs.
    state = cluster(gpu_node("a", gpus=2, cpus=4), gpu_node("b", gpus=2, cpus=64))
    mix = TaskMix([(TaskShape(1, 0, "", 2, 1), 1.0)])
    job = state.jobs[submit(state, cpus_per_task=4, mem_per_node_mb=1)]

    first_fit = FreeMap.of(state)
    hold(first_fit, "a", (), (), cpus=4)
    assert fragmentation(state, first_fit, mix) == pytest.approx(2.0)

    free = FreeMap.of(state)
    got = place(state, job, free, mix=mix)
    assert got is not None and got[0][0] == "b"
    free.take(got)
    assert fragmentation(state, free, mix) == 0.0


def test_a_share_goes_to_the_device_that_leaves_the_mix_usable_rather_than_the_tightest() -> None:
    # Best fit packs 300 onto GPU 0 (700 free), leaving 400: useless to the mix's
    # 600-milli tasks. FGD breaks GPU 1 instead: 700 and 700 both still serve them.
    state = cluster(gpu_node("a", gpus=2))
    mix = TaskMix([(TaskShape(0, 600, "", 1, 1), 1.0)])
    job = state.jobs[submit(state, gpu_milli=300, mem_per_node_mb=1)]

    free = FreeMap.of(state)
    hold(free, "a", (0,), (300,), cpus=1)
    packed = place(state, job, free.copy())
    assert packed is not None and packed[0][1].gpus == (0,)

    got = place(state, job, free, mix=mix)
    assert got is not None and got[0][1].gpus == (1,)
    free.take(got)
    assert fragmentation(state, free, mix) == 0.0


def test_a_job_uses_up_gpus_already_stranded_before_it_breaks_a_whole_node() -> None:
    state = cluster(gpu_node("a"), gpu_node("b"), gpu_node("c"))
    free = FreeMap.of(state)
    hold(free, "b", (0, 1, 2, 3), (1000,) * 4, cpus=1)
    mix = TaskMix([(TaskShape(8, 0, "", 1, 1), 1.0)])
    job = state.jobs[submit(state, gpus_per_node=4, mem_per_node_mb=1)]
    # b's last 4 GPUs are lost to the mix's 8-GPU tasks already: taking them shrinks
    # the fragment by 4 GPUs, while 4 of a or c would strand the other 4.
    got = place(state, job, free, mix=mix)
    assert got is not None and got[0][0] == "b"


def test_between_equal_growths_the_lower_node_in_best_fit_order_wins() -> None:
    state = cluster(gpu_node("a"), gpu_node("b"), gpu_node("c"))
    free = FreeMap.of(state)
    hold(free, "c", (0,), (1000,), cpus=1)
    mix = TaskMix([(TaskShape(1, 0, "", 1, 1), 1.0)])
    job = state.jobs[submit(state, gpus_per_node=1, mem_per_node_mb=1)]
    # One whole GPU grows nothing anywhere for 1-GPU tasks: c has the fewest left.
    got = place(state, job, free, mix=mix)
    assert got is not None and got[0][0] == "c"


def test_the_free_map_groups_every_node_by_its_current_signature() -> None:
    state = cluster(gpu_node("a"), gpu_node("b"), gpu_node("c"))
    free = FreeMap.of(state)
    assert [g.members for g in free.groups.values()] == [[0, 1, 2]]
    alloc = ("b", NodeAlloc(gpus=(3,), cpus=2, mem_mb=1, gpu_milli=(250,)))
    free.take([alloc])
    for sig, group in free.groups.items():
        assert all(node_sig(free.nodes[o]) == sig for o in group.members)
    assert sorted(o for g in free.groups.values() for o in g.members) == [0, 1, 2]
    free.give([alloc])
    assert [g.members for g in free.groups.values()] == [[0, 1, 2]]
