"""Small builders for core tests: nodes shaped like the simulated ones, and specs."""

from __future__ import annotations

import itertools
from typing import Any

from scheduler.core import commands as c
from scheduler.core.contract import JobSpec
from scheduler.core.resources import GpuDevice, NodeSpec
from scheduler.core.state import ClusterState

_ids = itertools.count(1)


def cmd_id() -> str:
    return f"cmd-{next(_ids)}"


def gpu_node(
    name: str, *, gpus: int = 8, model: str = "mi300x", cpus: int = 64, memory_mb: int = 524288
) -> NodeSpec:
    vendor = "amd" if model.startswith("mi") else "nvidia"
    link = "xgmi" if vendor == "amd" else "nvlink"
    return NodeSpec(
        name=name,
        cpus=cpus,
        memory_mb=memory_mb,
        agent_url=f"http://127.0.0.1:1/{name}",
        sockets=2,
        cores_per_socket=cpus // 2,
        gpus=tuple(
            GpuDevice(
                index=i,
                vendor=vendor,
                model=model,
                memory_mb=196608,
                numa=0 if i < gpus // 2 else 1,
                links=tuple((p, link) for p in range(gpus) if p != i),
            )
            for i in range(gpus)
        ),
    )


def spec(**kw: Any) -> JobSpec:
    kw.setdefault("script", "#!/bin/sh\ntrue\n")
    kw.setdefault("tenant", "acme")
    kw.setdefault("user", "alice")
    return JobSpec(**kw)


def cluster(
    *nodes: NodeSpec, partitions: tuple[c.PartitionDef, ...] | None = None, now: float = 1000.0
) -> ClusterState:
    state = ClusterState()
    parts = partitions or (c.PartitionDef(name="gpu", default=True),)
    state.apply(c.ConfigurePartitions(cmd_id(), now, parts))
    for node in nodes:
        state.apply(c.RegisterNode(cmd_id(), now, node))
    return state


def submit(state: ClusterState, now: float = 1001.0, key: str | None = None, **kw: Any) -> int:
    cid = key or cmd_id()
    state.apply(c.SubmitJob(cid, now, spec(**kw)))
    return state.submissions[cid]
