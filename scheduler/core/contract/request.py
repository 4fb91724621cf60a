"""What a job holds: its resource request, per node and in all, and its shape.

`ResourceRequest.of(spec, shards_per_gpu=...)` is the one derivation of GPUs, milli-GPUs,
CPUs and memory from a `JobSpec`: `--gpus=N` over `-N` nodes is ceil(N/nodes) on each
node (so `--gpus=3 -N2` holds 4 GPUs, and every layer says 4); `--gres=shard:S` is whole
GPUs when S fills them, else a share. The controller fixes a job's request when it
accepts it, so the API, squeue, sacct, limits, priority and fair share read the same
numbers.

`JobShape` is the request plus where it may run: everything placement reads. Jobs of
one shape place alike, so the planner tries placement once per shape, and the submit
check ("could this partition ever run it") is memoised by shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from weakref import WeakValueDictionary

from scheduler.core.contract.spec import JobSpec

MILLI = 1000  # milli-GPUs in one GPU
DEFAULT_SHARDS_PER_GPU = 8  # Slurm's common gres.conf Count=8 per GPU


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    nodes: int
    gpus_per_node: int  # whole devices on each node
    gpu_milli_per_node: int  # or a share of one device on each node (1..999)
    gpu_type: str  # "" any physical GPU, a model, or a partition profile
    cpus_per_node: int
    mem_per_node_mb: int | None  # None: the node's memory per CPU; 0: all of it

    @classmethod
    def of(cls, spec: JobSpec, *, shards_per_gpu: int = DEFAULT_SHARDS_PER_GPU) -> ResourceRequest:
        whole = spec.gpus_per_node or -(-spec.gpus // spec.nodes)
        milli = spec.gpu_milli
        if spec.shards:
            if spec.shards >= shards_per_gpu:
                whole = -(-spec.shards // shards_per_gpu)
            else:
                milli = max(1, spec.shards * MILLI // shards_per_gpu)
        tasks_per_node = -(-spec.ntasks // spec.nodes)
        return cls(
            nodes=spec.nodes,
            gpus_per_node=whole,
            gpu_milli_per_node=milli,
            gpu_type=spec.gpu_type,
            cpus_per_node=tasks_per_node * spec.cpus_per_task,
            mem_per_node_mb=spec.mem_per_node_mb,
        )

    @property
    def devices_per_node(self) -> int:
        """GPU devices the job touches on each node (a share touches one)."""
        return self.gpus_per_node or (1 if self.gpu_milli_per_node else 0)

    @property
    def gpus(self) -> int:
        """GPU devices in all: what the job shows as its GPUs and counts against limits."""
        return self.devices_per_node * self.nodes

    @property
    def cpus(self) -> int:
        return self.cpus_per_node * self.nodes

    # Milli-GPUs in all: what fair share and the size factor weigh. A field, not a
    # property: a pass reads it for every pending job.
    gpu_milli: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        total = (self.gpus_per_node * MILLI or self.gpu_milli_per_node) * self.nodes
        object.__setattr__(self, "gpu_milli", total)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class JobShape:
    """A job's request and where it may run: the key jobs are grouped by.

    Shapes are interned (`of` returns the one instance of each value) and carry their
    hash: a pass looks tens of thousands of jobs up by shape, and an identity match
    costs nothing where comparing two equal dataclasses field by field does."""

    partition: str
    resources: ResourceRequest
    constraint: str
    nodelist: tuple[str, ...]
    exclude: tuple[str, ...]
    exclusive: bool
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        value = (
            self.partition,
            self.resources,
            self.constraint,
            self.nodelist,
            self.exclude,
            self.exclusive,
        )
        object.__setattr__(self, "_hash", hash(value))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(
        cls, spec: JobSpec, partition: str, *, shards_per_gpu: int = DEFAULT_SHARDS_PER_GPU
    ) -> JobShape:
        return interned(
            cls(
                partition=partition,
                resources=ResourceRequest.of(spec, shards_per_gpu=shards_per_gpu),
                constraint=spec.constraint,
                nodelist=spec.nodelist,
                exclude=spec.exclude,
                exclusive=spec.exclusive,
            )
        )

    @property
    def where(self) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
        return (self.partition, self.constraint, self.nodelist, self.exclude)


_SHAPES: WeakValueDictionary[JobShape, JobShape] = WeakValueDictionary()


def interned(shape: JobShape) -> JobShape:
    """The one instance of this shape's value (a cache, not state: replicas never see it)."""
    return _SHAPES.setdefault(shape, shape)


__all__ = ["DEFAULT_SHARDS_PER_GPU", "MILLI", "JobShape", "ResourceRequest", "interned"]
