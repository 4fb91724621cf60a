"""The dashboard's GPU catalog: each kind of GPU the cluster has (vendor, model, memory),
how its GPUs are linked, and how many are free now of how many.

Built from the controller's whole node dicts (an operator's view: which devices are in
use, and the links between GPUs), but what leaves this module is only counts and names
per kind of GPU, the same for every tenant: no node's agent, addresses, or which device
which job holds. A GPU is free when its node takes work (idle or mix) and no job holds
any share of it.

Being the same for every tenant, the dashboard's catalog (with its prices, or the
scheduler's error) is kept for `KEPT_S` in each web process (`kept_catalog`): eight
dashboards a second cost one controller read, not eight. Then one request reads it again
while the others show the answer before it (no page waits on another's read), and while
the controller is unreachable that costs one attempt at a time, not one a page. "Free
now" is a second old, or the time of one read more, as it would be a moment after any
reload.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


@dataclass(frozen=True)
class DashboardCatalog:
    kinds: list[GpuKind]
    prices: dict[str, dict[str, str]]  # GPU model -> its price row (launch_quote.price_list)
    error: str  # why the scheduler could not be read, or ""


KEPT_S = 1.0
_kept: tuple[float, Any, DashboardCatalog] | None = None  # (expiry, key, catalog)
_reading = threading.Lock()


def kept_catalog(key: Any, read: Callable[[], DashboardCatalog]) -> DashboardCatalog:
    """`read()`'s answer for `key` (what the answer depends on besides time: the
    controller's addresses and token), read again after `KEPT_S` by one thread; the
    others meanwhile take the answer before it, or wait for it when there is none."""
    global _kept
    kept = _kept
    if kept is not None and kept[1] == key:
        if time.monotonic() < kept[0]:
            return kept[2]
        if not _reading.acquire(blocking=False):
            return kept[2]  # another thread reads it again
    else:
        _reading.acquire()
    try:
        kept = _kept
        if kept is not None and kept[1] == key and time.monotonic() < kept[0]:
            return kept[2]
        catalog = read()
        _kept = (time.monotonic() + KEPT_S, key, catalog)
        return catalog
    finally:
        _reading.release()


def forget_catalog() -> None:
    """The next dashboard reads the controller again (tests: each starts afresh)."""
    global _kept
    _kept = None
