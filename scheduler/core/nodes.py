"""Nodes as the controller tracks them: the reported `NodeSpec` plus what is allocated.

GPUs are shared in milli-GPUs: every device has 1000 and the shares of the jobs on it
never sum past that. A hardware partition (a device with a `parent`) and its physical
GPU exclude each other: while any share of one is held, the other is unavailable.
Everything here besides `spec`, `up`, `reason`, `drained`, `drain_reason` and
`registered_at` is derivable from the
jobs' allocations; `ClusterState.validate()` recomputes it and compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.jobs import NodeAlloc
from scheduler.core.resources import NodeSpec

MILLI = 1000


def related_devices(spec: NodeSpec) -> tuple[tuple[int, ...], ...]:
    """For each device, the devices it excludes: its parent, or its partitions."""
    related: list[list[int]] = [[] for _ in spec.gpus]
    for g in spec.gpus:
        if g.parent is not None:
            related[g.index].append(g.parent)
            related[g.parent].append(g.index)
    return tuple(tuple(r) for r in related)


@dataclass
class Node:
    spec: NodeSpec
    up: bool = True
    reason: str = ""  # why it is down
    # An operator's drain (scontrol update State=DRAIN): no new job is placed here while
    # it lasts; it outlives the node going down and registering again, as in Slurm.
    drained: bool = False
    drain_reason: str = ""
    registered_at: float = 0.0
    # Milli-GPU share of each job on each device, by device index.
    gpu_shares: list[dict[int, int]] = field(default_factory=list)
    # The job each bound CPU id belongs to (CPUs of unbound jobs are only counted).
    cpu_owner: dict[int, int] = field(default_factory=dict)
    cpus_alloc: int = 0
    mem_alloc_mb: int = 0
    jobs: set[int] = field(default_factory=set)
    # How many times the node was declared lost. Launches carry the epoch they were made
    # in, and the agent refuses one from before the last loss: its job was ended then,
    # and its GPUs may be another job's now (a launch can wait in a worker for minutes).
    epoch: int = 0

    def __post_init__(self) -> None:
        if len(self.gpu_shares) != len(self.spec.gpus):
            self.gpu_shares = [{} for _ in self.spec.gpus]
        self._related = related_devices(self.spec)

    def set_spec(self, spec: NodeSpec) -> None:
        """A re-registration: the GPU bookkeeping follows a changed device count (the
        state refuses that while jobs run here)."""
        self.spec = spec
        if len(self.gpu_shares) != len(spec.gpus):
            self.gpu_shares = [{} for _ in spec.gpus]
        self._related = related_devices(spec)

    def __getstate__(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        # Caches of the layout, rebuilt from the spec: not state.
        data.pop("_related", None)
        data.pop("_shape", None)
        return data

    def __setstate__(self, data: dict[str, Any]) -> None:
        # Snapshots from before milli-GPU sharing kept one owner per GPU.
        owners = data.pop("gpu_owner", None)
        if owners is not None:
            data["gpu_shares"] = [{} if o is None else {o: MILLI} for o in owners]
            data.setdefault("cpu_owner", {})
        data.setdefault("drained", False)  # snapshots from before drains
        data.setdefault("drain_reason", "")
        self.__dict__.update(data)
        self._related = related_devices(self.spec)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def takes_jobs(self) -> bool:
        """Whether the planner may place a new job here: up, and not drained."""
        return self.up and not self.drained

    @property
    def cpus_free(self) -> int:
        return self.spec.cpus - self.cpus_alloc

    @property
    def mem_free_mb(self) -> int:
        return self.spec.memory_mb - self.mem_alloc_mb

    @property
    def gpu_milli_used(self) -> list[int]:
        return [sum(shares.values()) for shares in self.gpu_shares]

    @property
    def gpu_owner(self) -> list[int | None]:
        """The (lowest) job holding each device, None when free: the whole-GPU view."""
        return [min(shares) if shares else None for shares in self.gpu_shares]

    def gpu_milli_free(self, index: int) -> int:
        """What a new share on this device may take: 0 while a related device is held."""
        if any(self.gpu_shares[r] for r in self._related[index]):
            return 0
        return MILLI - sum(self.gpu_shares[index].values())

    def free_gpus(self, model: str = "") -> list[int]:
        """Wholly free devices of that kind (a model names physical GPUs, a profile
        names partitions; no model: every physical GPU)."""
        return [
            g.index
            for g in self.spec.gpus
            if (g.kind == model if model else g.parent is None)
            and self.gpu_milli_free(g.index) == MILLI
        ]

    def gpus_of_model(self, model: str = "") -> list[int]:
        """Every device of that kind (free or not): capacity, for submit checks."""
        return [g.index for g in self.spec.gpus if (g.kind == model if model else g.parent is None)]

    def mem_for(self, requested_mb: int | None, cpus: int) -> int:
        """Memory a job gets here: --mem as given, all of it for --mem=0 (as Slurm), and
        without --mem its CPUs' share of the node."""
        if requested_mb is None:
            return cpus * (self.spec.memory_mb // self.spec.cpus)
        return requested_mb or self.spec.memory_mb

    def fits(self, alloc: NodeAlloc) -> bool:
        """Whether `alloc` can be added now: milli shares within each device, partitions
        apart from their parents, bound CPUs free, counts within the node."""
        if not self.takes_jobs or alloc.cpus > self.cpus_free or alloc.mem_mb > self.mem_free_mb:
            return False
        if alloc.gpu_milli and len(alloc.gpu_milli) != len(alloc.gpus):
            return False
        if len(set(alloc.gpus)) != len(alloc.gpus):
            return False
        chosen = set(alloc.gpus)
        for i, g in enumerate(alloc.gpus):
            if not 0 <= g < len(self.gpu_shares):
                return False
            if chosen.intersection(self._related[g]):
                return False
            milli = alloc.milli(i)
            if not 0 < milli <= self.gpu_milli_free(g):
                return False
        if not alloc.cpu_ids:
            return True  # counted, not bound
        return len(set(alloc.cpu_ids)) == len(alloc.cpu_ids) == alloc.cpus and all(
            0 <= c < self.spec.cpus and c not in self.cpu_owner for c in alloc.cpu_ids
        )

    def take(self, job_id: int, alloc: NodeAlloc) -> None:
        for i, g in enumerate(alloc.gpus):
            self.gpu_shares[g][job_id] = alloc.milli(i)
        for cpu in alloc.cpu_ids:
            self.cpu_owner[cpu] = job_id
        self.cpus_alloc += alloc.cpus
        self.mem_alloc_mb += alloc.mem_mb
        self.jobs.add(job_id)

    def give_back(self, job_id: int, alloc: NodeAlloc) -> None:
        for g in alloc.gpus:
            if 0 <= g < len(self.gpu_shares):
                self.gpu_shares[g].pop(job_id, None)
        for cpu in alloc.cpu_ids:
            if self.cpu_owner.get(cpu) == job_id:
                del self.cpu_owner[cpu]
        self.cpus_alloc -= alloc.cpus
        self.mem_alloc_mb -= alloc.mem_mb
        self.jobs.discard(job_id)

    def check(self, allocs: dict[int, NodeAlloc]) -> None:
        """Assert that the bookkeeping equals what `allocs` (job id -> what it holds
        here) adds up to, and that no device or CPU is over capacity."""
        shares: list[dict[int, int]] = [{} for _ in self.spec.gpus]
        owner: dict[int, int] = {}
        for job_id, alloc in allocs.items():
            for i, g in enumerate(alloc.gpus):
                assert 0 <= g < len(shares), f"{self.name}: job {job_id} on missing GPU {g}"
                shares[g][job_id] = alloc.milli(i)
            for cpu in alloc.cpu_ids:
                assert cpu not in owner, f"{self.name}: CPU {cpu} in jobs {owner[cpu]}, {job_id}"
                owner[cpu] = job_id
        assert shares == self.gpu_shares, f"{self.name}: GPU shares drifted"
        assert owner == self.cpu_owner, f"{self.name}: CPU binding drifted"
        for g, held in enumerate(shares):
            total = sum(held.values())
            assert total <= MILLI, f"{self.name}: GPU {g} shared past {MILLI} ({total})"
            assert not (held and any(shares[r] for r in self._related[g])), (
                f"{self.name}: GPU {g} and a partition of it are both held"
            )
        assert set(allocs) == self.jobs, f"{self.name}: job set drifted"

    @property
    def state_word(self) -> str:
        """Slurm's sinfo state: idle, mix, alloc, down, drain (sinfo tells a draining
        node, one with jobs still running, from a drained one by its allocation)."""
        if not self.up:
            return "down"
        if self.drained:
            return "drain"
        if not self.jobs:
            return "idle"
        physical = [g.index for g in self.spec.gpus if g.parent is None]
        gpus_full = all(self.gpu_milli_free(g) == 0 for g in physical)
        if self.cpus_free == 0 or (physical and gpus_full):
            return "alloc"
        return "mix"

    def to_dict(self) -> dict[str, Any]:
        out = self.spec.to_dict()
        # A GPU with any share held counts as in use (what sinfo and the web show).
        in_use = [i for i, shares in enumerate(self.gpu_shares) if shares]
        out.update(
            {
                "state": self.state_word,
                # Down: why it was lost; else the operator's drain reason, if any.
                "reason": self.reason if not self.up else self.drain_reason,
                "cpus_alloc": self.cpus_alloc,
                "memory_alloc_mb": self.mem_alloc_mb,
                "gpus_alloc": len(in_use),
                "gpus_in_use": in_use,
                "gpu_milli_used": self.gpu_milli_used,
                "registered_at": self.registered_at,
            }
        )
        return out
