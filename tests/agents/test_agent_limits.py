"""A job's limits from its allocation, how each enforcement holds them, and how each tells
that a job ran out of memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.limits import MIB, Cgroup2, JobLimits, Rlimits
from agents.sandbox import first_shell


def test_limits_come_from_the_allocation_on_this_node() -> None:
    limits = JobLimits.of({"cpu_ids": [2, 3], "mem_mb": 512}, pids_max=100, usable_cpus=range(8))
    assert limits == JobLimits(frozenset({2, 3}), 512 * MIB, 100)
    unbound = JobLimits.of({"cpu_ids": [64], "mem_mb": 0}, pids_max=100, usable_cpus=range(8))
    assert (unbound.cpus, unbound.memory_bytes) == (frozenset(), None)


def test_rlimits_are_set_by_the_jobs_first_shell_soft_and_hard() -> None:
    lines = Rlimits().shell(JobLimits(frozenset(), 64 * MIB, 50))
    assert lines[0] == "ulimit -d 65536 || exit 1"
    assert "ulimit -u 50" in lines[1] and "ulimit -p 50" in lines[1]
    assert "ulimit -u 50" in first_shell(lines)
    assert Rlimits().shell(JobLimits(frozenset(), None, 50))[0].startswith("ulimit -u 50")


@pytest.mark.parametrize(
    "tail, failed, oom",
    [
        (b"Traceback...\nMemoryError\n", True, True),
        (b"bash: xmalloc: cannot allocate 1073741824 bytes\n", True, True),
        (b"terminate called after throwing an instance of 'std::bad_alloc'\n", True, True),
        (b"mmap: Cannot allocate memory\n", True, True),
        (b"MemoryError\n", False, False),  # it handled it and succeeded
        (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n", True, False),
        (b"hipErrorOutOfMemory: out of memory on device 0\n", True, False),
        (b"Segmentation fault\n", True, False),
    ],
)
def test_rlimits_read_running_out_of_memory_from_the_jobs_errors(
    tail: bytes, failed: bool, oom: bool
) -> None:
    assert Rlimits().out_of_memory("7.1", failed=failed, error_tail=lambda: tail) is oom


def test_a_cgroup_holds_memory_and_processes_and_counts_oom_kills(tmp_path: Path) -> None:
    # A stand-in hierarchy: the files a cgroup v2 directory has, as plain files.
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    cgroups = Cgroup2(jobs)
    group = jobs / "7.1"
    group.mkdir()
    (group / "memory.swap.max").write_text("max")
    cgroups.attach("7.1", 4242, JobLimits(frozenset(), 64 * MIB, 50))
    assert (group / "memory.max").read_text() == str(64 * MIB)
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "pids.max").read_text() == "50"
    assert (group / "cgroup.procs").read_text() == "4242"
    assert cgroups.shell(JobLimits(frozenset(), 64 * MIB, 50)) == []
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert not cgroups.out_of_memory("7.1", failed=True, error_tail=lambda: b"MemoryError")
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroups.out_of_memory("7.1", failed=False, error_tail=lambda: b"")


def test_a_cgroup_is_frozen_and_thawed_whole(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    (jobs / "7.1").mkdir(parents=True)
    cgroups = Cgroup2(jobs)
    assert cgroups.freeze("7.1", True) is True
    assert (jobs / "7.1" / "cgroup.freeze").read_text() == "1"
    assert cgroups.freeze("7.1", False) is True
    assert (jobs / "7.1" / "cgroup.freeze").read_text() == "0"
    # No cgroup (the job does not run here): the caller falls back to signals.
    assert cgroups.freeze("8.1", True) is False
    assert Rlimits().freeze("7.1", True) is False
