"""Nodes and their devices, as the controller knows them.

Plain frozen data with a strict dict round trip: these travel in Raft commands, over
HTTP from agents, and into snapshots, so every field has one JSON shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.errors import InvalidSpec

# Link weights between two GPUs of one node: higher is a better path. Placement sums
# them over the chosen set, so xGMI/NVLink peers beat PCIe neighbours beat the far socket.
LINK_WEIGHTS: dict[str, int] = {"xgmi": 40, "nvlink": 40, "pcie-switch": 20, "pcie": 10, "sys": 5}


@dataclass(frozen=True)
class GpuDevice:
    index: int
    vendor: str  # "amd" | "nvidia"
    model: str  # "mi300x", "h100", ... (lower case; what --gres=gpu:<type>:N names)
    memory_mb: int
    numa: int = 0
    pci: str = ""
    uuid: str = ""
    # (peer index, link kind) for every other GPU of the node.
    links: tuple[tuple[int, str], ...] = ()
    # A hardware partition (AMD CPX/DPX/QPX, NVIDIA MIG) is a device of its own whose
    # `parent` is the physical GPU; a job on the parent excludes its partitions and the
    # other way round. `profile` names the partition kind ("cpx", "mig-1g.10gb"); jobs
    # ask for partitions by profile, for physical GPUs by model.
    parent: int | None = None
    profile: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "vendor": self.vendor,
            "model": self.model,
            "memory_mb": self.memory_mb,
            "numa": self.numa,
            "pci": self.pci,
            "uuid": self.uuid,
            "links": [[peer, kind] for peer, kind in self.links],
        }
        # Only partitions carry the new keys, so older readers keep parsing whole GPUs.
        if self.parent is not None:
            out["parent"] = self.parent
        if self.profile:
            out["profile"] = self.profile
        return out

    @property
    def kind(self) -> str:
        """What a request names to get this device: the profile of a partition, else
        the model."""
        return self.profile or self.model

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuDevice:
        _check_keys(data, cls, required={"index", "vendor", "model", "memory_mb"})
        links = tuple((int(p), str(k)) for p, k in data.get("links", ()))
        for _, kind in links:
            if kind not in LINK_WEIGHTS:
                raise InvalidSpec(f"unknown GPU link kind {kind!r}")
        return cls(
            index=int(data["index"]),
            vendor=str(data["vendor"]),
            model=str(data["model"]).lower(),
            memory_mb=int(data["memory_mb"]),
            numa=int(data.get("numa", 0)),
            pci=str(data.get("pci", "")),
            uuid=str(data.get("uuid", "")),
            links=links,
            parent=None if data.get("parent") is None else int(data["parent"]),
            profile=str(data.get("profile", "")).lower(),
        )


@dataclass(frozen=True)
class NodeSpec:
    """What an agent reports about its node when it registers."""

    name: str
    cpus: int
    memory_mb: int
    agent_url: str
    sockets: int = 1
    cores_per_socket: int = 1
    threads_per_core: int = 1
    gpus: tuple[GpuDevice, ...] = ()
    features: tuple[str, ...] = ()
    # Free-form facts for operators (kernel, driver version, simulated or real).
    labels: tuple[tuple[str, str], ...] = field(default=())
    # CPU ids of each NUMA node, so placement binds a job's CPUs next to its GPUs. When
    # an agent does not report them they are split evenly over the GPUs' NUMA nodes.
    numa_cpus: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if (
            not self.name
            or len(self.name) > 63
            or not self.name.replace("-", "").replace("_", "").isalnum()
            or not self.name.isascii()
        ):
            raise InvalidSpec(f"invalid node name {self.name[:80]!r}")
        if self.cpus < 1 or self.memory_mb < 1:
            raise InvalidSpec(f"node {self.name}: cpus and memory must be positive")
        # Bounded like everything that reaches the log: a node is described by its agent,
        # which holds the cluster token, but a bug or a leak must not bloat the state.
        if self.cpus > 1 << 16 or self.memory_mb > 1 << 32 or len(self.gpus) > 1024:
            raise InvalidSpec(f"node {self.name}: more CPUs, memory or GPUs than any node has")
        if len(self.agent_url) > 1024 or not self.agent_url.isprintable():
            raise InvalidSpec(f"node {self.name}: agent_url must be a URL")
        texts = [*self.features, *(t for pair in self.labels for t in pair)]
        if len(self.features) > 256 or len(self.labels) > 256 or any(len(t) > 256 for t in texts):
            raise InvalidSpec(f"node {self.name}: too many or too long features or labels")
        if [g.index for g in self.gpus] != list(range(len(self.gpus))):
            raise InvalidSpec(f"node {self.name}: GPU indices must be 0..n-1 in order")
        for g in self.gpus:
            if g.parent is None:
                continue
            if not 0 <= g.parent < len(self.gpus) or g.parent == g.index:
                raise InvalidSpec(f"node {self.name}: GPU {g.index} has no parent {g.parent}")
            if self.gpus[g.parent].parent is not None:
                raise InvalidSpec(f"node {self.name}: GPU {g.index}: partitions do not nest")
        if not self.numa_cpus:
            object.__setattr__(self, "numa_cpus", _even_numa(self.cpus, self.gpus))
        ids = [cpu for domain in self.numa_cpus for cpu in domain]
        if len(set(ids)) != len(ids) or not all(0 <= cpu < self.cpus for cpu in ids):
            raise InvalidSpec(f"node {self.name}: numa_cpus must be distinct ids 0..cpus-1")
        if any(g.numa >= len(self.numa_cpus) or g.numa < 0 for g in self.gpus):
            raise InvalidSpec(f"node {self.name}: a GPU names a NUMA node without CPUs")

    @property
    def gpu_models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "agent_url": self.agent_url,
            "sockets": self.sockets,
            "cores_per_socket": self.cores_per_socket,
            "threads_per_core": self.threads_per_core,
            "gpus": [g.to_dict() for g in self.gpus],
            "features": list(self.features),
            "labels": dict(self.labels),
            "numa_cpus": [list(domain) for domain in self.numa_cpus],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeSpec:
        _check_keys(data, cls, required={"name", "cpus", "memory_mb", "agent_url"})
        try:
            return cls(
                name=str(data["name"]),
                cpus=int(data["cpus"]),
                memory_mb=int(data["memory_mb"]),
                agent_url=str(data["agent_url"]),
                sockets=int(data.get("sockets", 1)),
                cores_per_socket=int(data.get("cores_per_socket", 1)),
                threads_per_core=int(data.get("threads_per_core", 1)),
                gpus=tuple(GpuDevice.from_dict(g) for g in data.get("gpus", ())),
                features=tuple(str(f) for f in data.get("features", ())),
                labels=tuple(sorted((str(k), str(v)) for k, v in data.get("labels", {}).items())),
                numa_cpus=tuple(
                    tuple(int(cpu) for cpu in domain) for domain in data.get("numa_cpus", ())
                ),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidSpec(f"invalid node description: {exc}") from exc


def _even_numa(cpus: int, gpus: tuple[GpuDevice, ...]) -> tuple[tuple[int, ...], ...]:
    domains = max((g.numa for g in gpus), default=0) + 1
    if domains > cpus:
        return tuple((i,) if i < cpus else () for i in range(domains))
    size, extra = divmod(cpus, domains)
    out: list[tuple[int, ...]] = []
    start = 0
    for d in range(domains):
        end = start + size + (1 if d < extra else 0)
        out.append(tuple(range(start, end)))
        start = end
    return tuple(out)


def _check_keys(data: Any, cls: type, *, required: set[str]) -> None:
    if not isinstance(data, dict):
        raise InvalidSpec(f"{cls.__name__} must be an object")
    known = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    unknown = set(data) - known
    if unknown:
        raise InvalidSpec(f"{cls.__name__}: unknown field(s) {', '.join(sorted(unknown))}")
    missing = required - set(data)
    if missing:
        raise InvalidSpec(f"{cls.__name__}: missing field(s) {', '.join(sorted(missing))}")
