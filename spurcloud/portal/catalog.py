"""The dashboard's GPU catalog: each kind of GPU the cluster has (vendor, model, memory),
how its GPUs are linked, and how many are free now of how many.

Built from the controller's whole node dicts (an operator's view: which devices are in
use, and the links between GPUs), but what leaves this module is only counts and names
per kind of GPU, the same for every tenant: no node's agent, addresses, or which device
which job holds. A GPU is free when its node takes work (idle or mix) and no job holds
any share of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.core.resources import LINK_WEIGHTS

# sinfo's states of a node that takes new work.
TAKES_WORK = frozenset({"idle", "mix"})
LINK_NAMES = {
    "xgmi": "xGMI",
    "nvlink": "NVLink",
    "pcie-switch": "PCIe switch",
    "pcie": "PCIe",
    "sys": "across sockets",
}


@dataclass(frozen=True)
class GpuKind:
    vendor: str
    model: str
    memory_mb: int
    interconnect: str  # the best link between two GPUs of this kind on one node; "" if none
    free: int
    total: int
    nodes: int


def gpu_catalog(nodes: list[dict[str, Any]]) -> list[GpuKind]:
    kinds: dict[tuple[str, str, int], dict[str, Any]] = {}
    for node in nodes:
        takes_work = node.get("state") in TAKES_WORK
        in_use = set(node.get("gpus_in_use") or ())
        for gpu in node.get("gpus") or ():
            key = (
                str(gpu.get("vendor", "")),
                str(gpu.get("model", "")),
                int(gpu.get("memory_mb") or 0),
            )
            kind = kinds.setdefault(key, {"free": 0, "total": 0, "nodes": set(), "link": ""})
            kind["total"] += 1
            kind["free"] += int(takes_work and gpu.get("index") not in in_use)
            kind["nodes"].add(node.get("name"))
            for _, link in gpu.get("links") or ():
                if LINK_WEIGHTS.get(link, 0) > LINK_WEIGHTS.get(kind["link"], 0):
                    kind["link"] = link
    return [
        GpuKind(
            vendor=vendor,
            model=model,
            memory_mb=memory_mb,
            interconnect=LINK_NAMES.get(kind["link"], kind["link"]),
            free=kind["free"],
            total=kind["total"],
            nodes=len(kind["nodes"]),
        )
        for (vendor, model, memory_mb), kind in sorted(kinds.items())
    ]
