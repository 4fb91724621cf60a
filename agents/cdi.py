"""Container Device Interface (CDI) specs for this node's GPUs.

A container runtime that reads `<spool>/cdi/` (podman, containerd and CRI-O take a spec
directory) can then start a job's container with `--device nvidia.com/gpu=2`: the
runtime adds exactly that GPU's device nodes, and the job sees it as device 0 (which is
why `job_environment(container=True)` numbers devices from zero).

Shape per the CDI specification (cncf-tags/container-device-interface, SPEC.md, v0.6.0):
`{"cdiVersion", "kind", "devices": [{"name", "containerEdits"}], "containerEdits"}`;
`containerEdits` holds `deviceNodes` (`{"path"}`, and `hostPath` where the node lives
elsewhere on the host) and `env` (`"KEY=value"` strings). The spec-level edits apply
whenever any device of the kind is requested.

The agent's own sandbox reads the same spec (`device_nodes`): a job's /dev holds the
nodes of its GPUs and the spec-level ones, nothing else.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from scheduler.core.resources import GpuDevice

CDI_VERSION = "0.6.0"
KINDS = {"amd": "amd.com/gpu", "nvidia": "nvidia.com/gpu"}
# The AMD render nodes start at minor 128; /dev/dri/renderD<128+i> is GPU i in PCI order.
AMD_RENDER_BASE = 128


def cdi_kind(vendor: str) -> str:
    try:
        return KINDS[vendor]
    except KeyError:
        raise ValueError(f"no CDI kind for GPU vendor {vendor!r}") from None


def cdi_device_names(vendor: str, indices: Iterable[int]) -> list[str]:
    """The fully qualified names a runtime takes: ["nvidia.com/gpu=0", ...]."""
    kind = cdi_kind(vendor)
    return [f"{kind}={int(i)}" for i in indices]


def cdi_spec(gpus: Sequence[GpuDevice]) -> dict[str, Any]:
    """One spec for the node's GPUs, which are all of one vendor."""
    vendors = {g.vendor for g in gpus}
    if len(vendors) != 1:
        raise ValueError(f"a CDI spec covers one GPU vendor, not {sorted(vendors) or 'none'}")
    vendor = vendors.pop()
    devices = []
    for gpu in gpus:
        if vendor == "amd":
            nodes = [f"/dev/dri/renderD{AMD_RENDER_BASE + gpu.index}"]
        else:
            nodes = [f"/dev/nvidia{gpu.index}"]
        env = [f"SPUR_GPU_PCI={gpu.pci}", f"SPUR_GPU_UUID={gpu.uuid}"]
        devices.append(
            {
                "name": str(gpu.index),
                "containerEdits": {"deviceNodes": [{"path": p} for p in nodes], "env": env},
            }
        )
    shared = ["/dev/kfd"] if vendor == "amd" else ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(vendor),
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [{"path": p} for p in shared],
            "env": [f"SPUR_GPU_VENDOR={vendor}"],
        },
    }


def device_nodes(spec: dict[str, Any], indices: Iterable[int]) -> list[tuple[str, str]]:
    """`(host path, path in the job)` of every device node a job holding the GPUs
    `indices` gets: each device's nodes, then the spec-level ones; none without GPUs.
    An index the spec does not name gets nothing (it is not a GPU of this node)."""
    wanted = {str(int(i)) for i in indices}
    if not wanted:
        return []
    devices = spec.get("devices", ())
    edits = [d.get("containerEdits", {}) for d in devices if d.get("name") in wanted]
    edits.append(spec.get("containerEdits", {}))
    nodes: list[tuple[str, str]] = []
    for edit in edits:
        for node in edit.get("deviceNodes", ()):
            path = str(node["path"])
            entry = (str(node.get("hostPath") or path), path)
            if entry not in nodes:
                nodes.append(entry)
    return nodes


def read_cdi_spec(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The spec at `path`, or an empty one (no devices) when there is none."""
    if path is None:
        return {}
    try:
        spec: dict[str, Any] = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    return spec


def write_cdi_spec(spool_dir: str | os.PathLike[str], gpus: Sequence[GpuDevice]) -> Path | None:
    """Write `<spool>/cdi/<vendor>-gpu.json` atomically; None for a node without GPUs."""
    if not gpus:
        return None
    spec = cdi_spec(gpus)
    vendor = gpus[0].vendor
    directory = Path(spool_dir) / "cdi"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{vendor}-gpu.json"
    # A runtime may read the directory at any moment: it must see the old or the new
    # spec, never half of one.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{vendor}-gpu.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
