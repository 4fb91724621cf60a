"""What a job may use of its node (CPUs, memory, processes), and whether it ran out of memory.

CPUs: the job's sandbox is bound to the allocation's `cpu_ids` (placement already chose
them from the NUMA nodes of the job's GPUs) before the job's first process starts, so
everything it forks inherits the binding. A simulated node's ids may not exist on the
machine that plays it: the job then runs unbound.

Memory (the allocation's `mem_mb`) and processes (`[agent] pids_max`) are held by one of:

- **cgroup v2** (`Cgroup2`), where the agent's own cgroup has the memory and pids
  controllers and it may write to it (root, or a delegated systemd unit): each job gets
  a cgroup with `memory.max`, no swap, and `pids.max`, for all of its processes
  together. Running out of memory is known for certain: the kernel counts its OOM kills
  in `memory.events`.
- **rlimits** (`Rlimits`) everywhere else: the job's first shell lowers its own limits,
  soft and hard (a job cannot raise a hard limit back: that takes CAP_SYS_RESOURCE in
  the host's namespace). Memory is RLIMIT_DATA, not RLIMIT_AS: GPU runtimes reserve
  address space they never touch (CUDA's unified addressing reserves as much as the
  host and every GPU hold together), so any address-space cap small enough to mean
  anything stops every GPU program at start, while RLIMIT_DATA (Linux >= 4.7) counts
  what a job fills: its heap and private writable mappings, not PROT_NONE reservations.
  It holds each process, not the job: n processes may take n times mem_mb. Processes are
  RLIMIT_NPROC, which counts the tasks of one uid within a user namespace; every sandbox
  is a user namespace of its own and the limit is set inside it, so it caps this job,
  not its whole organisation. Running out of memory is a failed allocation (ENOMEM)
  that each program reports its own way, so it is recognised from the end of the job's
  error output (`OOM_PATTERN`) when the job failed; a program that dies silently on
  ENOMEM, or output sent to /dev/null, goes unnoticed, and a job that prints such a line
  and fails for another reason is taken for out of memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

DEFAULT_PIDS_MAX = 16384
MIB = 1024 * 1024
# Lines that say a program ran out of host memory: Python, C (strerror(ENOMEM)), C++,
# bash, and the "Out of memory!" of perl, awk and many others. A line about a GPU's memory
# (CUDA and HIP say "out of memory" too) is not the host's.
OOM_PATTERN = re.compile(
    rb"MemoryError|Cannot allocate memory|std::bad_alloc|xmalloc: cannot allocate"
    rb"|memory exhausted|[Oo]ut of memory",
)
_GPU_LINE = re.compile(rb"CUDA|cuda|HIP|hip|GPU|[Dd]evice")
_TAIL = 8192


@dataclass(frozen=True)
class JobLimits:
    cpus: frozenset[int]  # empty: not bound
    memory_bytes: int | None  # None: no limit
    pids: int

    @classmethod
    def of(
        cls, allocation: Mapping[str, Any], *, pids_max: int, usable_cpus: Collection[int]
    ) -> JobLimits:
        """The limits of a job's allocation on this node (its `allocation[node]` dict)."""
        wanted = frozenset(int(c) for c in allocation.get("cpu_ids") or ())
        cpus = wanted if wanted and wanted <= set(usable_cpus) else frozenset()
        if wanted and not cpus:
            log.debug("cpu_ids %s are not all on this machine: not binding", sorted(wanted))
        mem_mb = int(allocation.get("mem_mb") or 0)
        return cls(cpus, mem_mb * MIB if mem_mb > 0 else None, pids_max)


class Enforcement(Protocol):
    """How memory and process limits are held, and how running out of memory is seen."""

    kind: str  # what the `started` report says: "cgroup2" or "rlimit"

    def shell(self, limits: JobLimits) -> list[str]:
        """Lines the job's first shell runs, inside its sandbox, before the script."""
        ...

    def attach(self, name: str, pid: int, limits: JobLimits) -> None:
        """Hold the process `pid` (not yet running the job) and all it will start."""
        ...

    def out_of_memory(
        self, name: str, *, failed: bool, error_tail: Callable[[], bytes]
    ) -> bool: ...

    def freeze(self, name: str, frozen: bool) -> bool:
        """Freeze (scontrol suspend) or thaw every process of the job at once; False when
        this enforcement cannot (the agent then stops and continues them by signal)."""
        ...

    def release(self, name: str) -> None: ...


class Rlimits:
    kind = "rlimit"

    def shell(self, limits: JobLimits) -> list[str]:
        lines = []
        if limits.memory_bytes is not None:
            kib = _within_hard(resource.RLIMIT_DATA, limits.memory_bytes) // 1024
            lines.append(f"ulimit -d {int(kib)} || exit 1")
        pids = _within_hard(resource.RLIMIT_NPROC, limits.pids)
        # bash says -u, dash says -p (bash's -p is the pipe size, which it cannot set).
        lines.append(f"ulimit -u {int(pids)} 2>/dev/null || ulimit -p {int(pids)} || exit 1")
        return lines

    def attach(self, name: str, pid: int, limits: JobLimits) -> None:
        return None

    def out_of_memory(self, name: str, *, failed: bool, error_tail: Callable[[], bytes]) -> bool:
        if not failed:
            return False
        try:
            tail = error_tail()
        except OSError:
            return False
        return any(
            OOM_PATTERN.search(line) and not _GPU_LINE.search(line) for line in tail.splitlines()
        )

    def freeze(self, name: str, frozen: bool) -> bool:
        return False

    def release(self, name: str) -> None:
        return None


class Cgroup2:
    """One cgroup per job, under `<the agent's cgroup>/jobs/`."""

    kind = "cgroup2"

    def __init__(self, jobs: Path) -> None:
        self.jobs = jobs

    @classmethod
    def detect(cls) -> Cgroup2 | None:
        """Cgroup v2 job limits if the agent's cgroup allows them, else None (and why, in
        the log). The agent moves itself into a leaf `spurd/` first: a cgroup that hands
        controllers to its children may hold no process of its own."""
        try:
            mount = _cgroup2_mount()
            own = _own_cgroup()
            if mount is None or own is None:
                log.info("no cgroup v2 hierarchy for this process: limits are rlimits")
                return None
            base = Path(mount) / own.lstrip("/")
            controllers = set((base / "cgroup.controllers").read_text().split())
            if not {"memory", "pids"} <= controllers:
                log.info(
                    "cgroup %s lacks the memory or pids controller (%s): limits are rlimits",
                    base,
                    " ".join(sorted(controllers)) or "none",
                )
                return None
            members = (base / "cgroup.procs").read_text().split()
            if own != "/" and members not in ([str(os.getpid())], []):
                log.info("cgroup %s holds other processes: limits are rlimits", base)
                return None
            if own != "/":
                leaf = base / "spurd"
                leaf.mkdir(exist_ok=True)
                (leaf / "cgroup.procs").write_text(str(os.getpid()))
            (base / "cgroup.subtree_control").write_text("+memory +pids")
            jobs = base / "jobs"
            jobs.mkdir(exist_ok=True)
            (jobs / "cgroup.subtree_control").write_text("+memory +pids")
        except OSError as exc:
            log.info("cgroup v2 is not writable here (%s): limits are rlimits", exc)
            return None
        log.info("job limits: cgroup v2 under %s", jobs)
        return cls(jobs)

    def shell(self, limits: JobLimits) -> list[str]:
        return []

    def attach(self, name: str, pid: int, limits: JobLimits) -> None:
        group = self.jobs / name
        group.mkdir(exist_ok=True)
        if limits.memory_bytes is not None:
            (group / "memory.max").write_text(str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: no file
                (group / "memory.swap.max").write_text("0")
        (group / "pids.max").write_text(str(limits.pids))
        (group / "cgroup.procs").write_text(str(pid))

    def out_of_memory(self, name: str, *, failed: bool, error_tail: Callable[[], bytes]) -> bool:
        try:
            events = (self.jobs / name / "memory.events").read_text()
        except OSError:
            return False
        counts = dict(line.split() for line in events.splitlines() if line.count(" ") == 1)
        return int(counts.get("oom_kill", "0")) > 0

    def freeze(self, name: str, frozen: bool) -> bool:
        # cgroup.freeze stops the whole group, what it forks meanwhile included, where a
        # SIGSTOP per process could miss a child forked between the listing and the
        # signal; and the job cannot see it or undo it (no SIGCONT of its own wakes it).
        try:
            (self.jobs / name / "cgroup.freeze").write_text("1" if frozen else "0")
        except OSError as exc:
            log.info(
                "cannot %s cgroup %s (%s): by signal", "freeze" if frozen else "thaw", name, exc
            )
            return False
        return True

    def release(self, name: str) -> None:
        group = self.jobs / name
        if not group.exists():
            return
        with contextlib.suppress(OSError):
            (group / "cgroup.kill").write_text("1")
        for _ in range(50):  # the killed processes leave the cgroup as they are reaped
            try:
                group.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
        log.warning("cgroup %s is still busy; left behind", group)


def detect(*, allow_cgroups: bool = True) -> Enforcement:
    found = Cgroup2.detect() if allow_cgroups else None
    return found if found is not None else Rlimits()


def read_tail(fd: int, size: int = _TAIL) -> bytes:
    with os.fdopen(fd, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(max(0, end - size))
        return f.read(size)


def _within_hard(which: int, wanted: int) -> int:
    # The job inherits the agent's hard limit, and no shell may raise it.
    hard = resource.getrlimit(which)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _cgroup2_mount() -> str | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return left.split()[4]
    return None


def _own_cgroup() -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None
