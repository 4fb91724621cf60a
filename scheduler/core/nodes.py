"""Nodes as the controller tracks them: the reported `NodeSpec` plus what is allocated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.jobs import NodeAlloc
from scheduler.core.resources import NodeSpec


@dataclass
class Node:
    spec: NodeSpec
    up: bool = True
    reason: str = ""
    registered_at: float = 0.0
    # Owner of each GPU by index (None: free). Derivable from the jobs; `validate()` checks.
    gpu_owner: list[int | None] = field(default_factory=list)
    cpus_alloc: int = 0
    mem_alloc_mb: int = 0
    jobs: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.gpu_owner:
            self.gpu_owner = [None] * len(self.spec.gpus)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def cpus_free(self) -> int:
        return self.spec.cpus - self.cpus_alloc

    @property
    def mem_free_mb(self) -> int:
        return self.spec.memory_mb - self.mem_alloc_mb

    def free_gpus(self, model: str = "") -> list[int]:
        return [
            g.index
            for g in self.spec.gpus
            if self.gpu_owner[g.index] is None and (not model or g.model == model)
        ]

    def gpus_of_model(self, model: str = "") -> list[int]:
        """Every GPU of the node (free or not) of that model: capacity, for submit checks."""
        return [g.index for g in self.spec.gpus if not model or g.model == model]

    def mem_for(self, requested_mb: int | None, cpus: int) -> int:
        """Memory a job gets here: --mem as given, all of it for --mem=0 (as Slurm), and
        without --mem its CPUs' share of the node."""
        if requested_mb is None:
            return cpus * (self.spec.memory_mb // self.spec.cpus)
        return requested_mb or self.spec.memory_mb

    def fits(self, alloc: NodeAlloc) -> bool:
        return (
            self.up
            and alloc.cpus <= self.cpus_free
            and alloc.mem_mb <= self.mem_free_mb
            and all(0 <= g < len(self.gpu_owner) and self.gpu_owner[g] is None for g in alloc.gpus)
        )

    def take(self, job_id: int, alloc: NodeAlloc) -> None:
        for g in alloc.gpus:
            self.gpu_owner[g] = job_id
        self.cpus_alloc += alloc.cpus
        self.mem_alloc_mb += alloc.mem_mb
        self.jobs.add(job_id)

    def give_back(self, job_id: int, alloc: NodeAlloc) -> None:
        for g in alloc.gpus:
            if self.gpu_owner[g] == job_id:
                self.gpu_owner[g] = None
        self.cpus_alloc -= alloc.cpus
        self.mem_alloc_mb -= alloc.mem_mb
        self.jobs.discard(job_id)

    @property
    def state_word(self) -> str:
        """Slurm's sinfo state: idle, mix, alloc, down."""
        if not self.up:
            return "down"
        if not self.jobs:
            return "idle"
        gpus_full = all(o is not None for o in self.gpu_owner)
        if self.cpus_free == 0 or (self.gpu_owner and gpus_full):
            return "alloc"
        return "mix"

    def to_dict(self) -> dict[str, Any]:
        out = self.spec.to_dict()
        out.update(
            {
                "state": self.state_word,
                "reason": self.reason,
                "cpus_alloc": self.cpus_alloc,
                "memory_alloc_mb": self.mem_alloc_mb,
                "gpus_alloc": sum(o is not None for o in self.gpu_owner),
                "gpus_in_use": [i for i, o in enumerate(self.gpu_owner) if o is not None],
                "registered_at": self.registered_at,
            }
        )
        return out
