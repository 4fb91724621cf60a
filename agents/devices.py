"""What this node has: CPUs, memory and GPUs, as the `NodeSpec` the agent registers.

`sim:<profile>` describes a made-up but realistic node (the embedded platform and tests
run on machines without GPUs); `auto` asks the hardware. Every parser of tool or /proc
output is a pure function of the text, tested against captured samples; only the small
`discover_*` functions run commands or read files.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scheduler.core.resources import GpuDevice, NodeSpec

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], str]


@dataclass(frozen=True)
class HostFacts:
    cpus: int
    memory_mb: int
    sockets: int = 1
    cores_per_socket: int = 1
    threads_per_core: int = 1


# -- simulated nodes -------------------------------------------------------------------


@dataclass(frozen=True)
class SimProfile:
    vendor: str
    model: str
    memory_mb: int
    link: str
    # PCI buses of the 8 GPUs, as on the vendor's reference 8-GPU servers.
    buses: tuple[str, ...]
    host: HostFacts
    # Hardware partitions of every GPU (profile, count), e.g. MI300X in CPX mode is 8
    # XCD partitions per GPU and H100 MIG 1g.10gb is 7; count 0: whole GPUs only.
    partitions: tuple[str, int] = ("", 0)


SIM_PROFILES: dict[str, SimProfile] = {
    # AMD Instinct MI300X platform (OAM, one xGMI hive of 8), 2 x 96-core EPYC.
    "mi300x-8": SimProfile(
        vendor="amd",
        model="mi300x",
        memory_mb=192 * 1024,
        link="xgmi",
        buses=("0c", "22", "38", "5c", "9f", "af", "bf", "df"),
        host=HostFacts(
            cpus=384, memory_mb=2048 * 1024, sockets=2, cores_per_socket=96, threads_per_core=2
        ),
    ),
    # NVIDIA HGX H100 8-GPU (NVSwitch: NVLink between every pair), 2 x 56-core Xeon.
    "h100-8": SimProfile(
        vendor="nvidia",
        model="h100",
        memory_mb=80 * 1024,
        link="nvlink",
        buses=("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"),
        host=HostFacts(
            cpus=224, memory_mb=2048 * 1024, sockets=2, cores_per_socket=56, threads_per_core=2
        ),
    ),
}
SIM_PROFILES["mi300x-8-cpx"] = replace(SIM_PROFILES["mi300x-8"], partitions=("cpx", 8))
SIM_PROFILES["h100-8-mig"] = replace(SIM_PROFILES["h100-8"], partitions=("mig-1g.10gb", 7))


def numa_cpus(host: HostFacts) -> tuple[tuple[int, ...], ...]:
    """CPU ids per NUMA node (one per socket, NPS1), numbered as Linux numbers them:
    the first thread of every core, socket by socket, then the second threads."""
    cores = host.cores_per_socket
    per_thread = host.sockets * cores
    return tuple(
        tuple(
            t * per_thread + s * cores + c
            for t in range(host.threads_per_core)
            for c in range(cores)
        )
        for s in range(host.sockets)
    )


def simulated_gpus(profile: str, *, node: str = "sim") -> tuple[GpuDevice, ...]:
    try:
        sim = SIM_PROFILES[profile]
    except KeyError:
        known = ", ".join(f"sim:{name}" for name in sorted(SIM_PROFILES))
        raise ValueError(f"unknown device profile sim:{profile} (known: {known})") from None
    count = len(sim.buses)
    physical = [
        GpuDevice(
            index=i,
            vendor=sim.vendor,
            model=sim.model,
            memory_mb=sim.memory_mb,
            numa=0 if i < count // 2 else 1,
            pci=f"0000:{bus}:00.0",
            # Stable per node and index, so a re-registering agent reports the same GPUs.
            uuid=f"GPU-sim-{node}-{sim.model}-{i}",
            links=tuple((peer, sim.link) for peer in range(count) if peer != i),
        )
        for i, bus in enumerate(sim.buses)
    ]
    profile, parts = sim.partitions
    children: list[GpuDevice] = []
    for gpu in physical:
        first = count + len(children)
        siblings = range(first, first + parts)
        children.extend(
            GpuDevice(
                index=index,
                vendor=sim.vendor,
                model=sim.model,
                memory_mb=sim.memory_mb // parts,
                numa=gpu.numa,
                pci=gpu.pci,
                uuid=f"{gpu.uuid}-{profile}-{index - first}",
                # Partitions of one GPU share its die: the strongest link there is.
                links=tuple((peer, sim.link) for peer in siblings if peer != index),
                parent=gpu.index,
                profile=profile,
            )
            for index in siblings
        )
    return (*physical, *children)


# -- /proc ----------------------------------------------------------------------------


def parse_meminfo(text: str) -> int:
    """MemTotal in MB."""
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    if not match:
        raise ValueError("no MemTotal in /proc/meminfo")
    return int(match.group(1)) // 1024


def parse_cpuinfo(text: str) -> HostFacts:
    """Sockets, cores and threads from x86 /proc/cpuinfo (memory_mb left 1)."""
    processors = 0
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    for block in re.split(r"\n\s*\n", text.strip()):
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in block.splitlines())
        )
        if "processor" not in fields:
            continue
        processors += 1
        socket = fields.get("physical id", "0")
        sockets.add(socket)
        cores.add((socket, fields.get("core id", str(processors))))
    if processors == 0:
        raise ValueError("no processors in /proc/cpuinfo")
    n_sockets = max(len(sockets), 1)
    n_cores = max(len(cores), 1)
    return HostFacts(
        cpus=processors,
        memory_mb=1,
        sockets=n_sockets,
        cores_per_socket=max(n_cores // n_sockets, 1),
        threads_per_core=max(processors // n_cores, 1),
    )


def discover_host(proc: Path = Path("/proc")) -> HostFacts:
    cpus = os.cpu_count() or 1
    try:
        facts = parse_cpuinfo((proc / "cpuinfo").read_text())
    except (OSError, ValueError):
        facts = HostFacts(cpus=cpus, memory_mb=1)
    try:
        memory_mb = parse_meminfo((proc / "meminfo").read_text())
    except (OSError, ValueError):
        memory_mb = 1024
    # cpuinfo on other architectures lacks the topology fields: trust the kernel's count.
    if facts.sockets * facts.cores_per_socket * facts.threads_per_core != cpus:
        facts = HostFacts(cpus=cpus, memory_mb=1)
    return HostFacts(
        cpus=cpus,
        memory_mb=memory_mb,
        sockets=facts.sockets,
        cores_per_socket=facts.cores_per_socket,
        threads_per_core=facts.threads_per_core,
    )


# -- NVIDIA -----------------------------------------------------------------------------

NVIDIA_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,pci.bus_id,uuid",
    "--format=csv,noheader,nounits",
]
NVIDIA_TOPO = ["nvidia-smi", "topo", "-m"]

# `nvidia-smi topo -m` legend -> our link kinds (resources.LINK_WEIGHTS).
_TOPO_LINKS = {"PIX": "pcie-switch", "PXB": "pcie-switch", "PHB": "pcie", "NODE": "pcie"}


@dataclass(frozen=True)
class NvidiaGpu:
    index: int
    name: str
    memory_mb: int
    pci: str
    uuid: str


def parse_nvidia_query(text: str) -> list[NvidiaGpu]:
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, name, memory, bus_id, uuid = parts
        gpus.append(NvidiaGpu(int(index), name, int(float(memory)), _short_pci(bus_id), uuid))
    return sorted(gpus, key=lambda g: g.index)


def nvidia_model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100'."""
    words = [w for w in name.split() if w.lower() not in {"nvidia", "tesla", "geforce", "quadro"}]
    if not words:
        return "gpu"
    first = words[0].split("-")[0].lower()
    if first.isalpha() and len(words) > 1:  # 'RTX 4090' -> 'rtx4090'
        first += words[1].split("-")[0].lower()
    return first


@dataclass(frozen=True)
class Topology:
    links: dict[int, dict[int, str]]
    numa: dict[int, int]


def parse_nvidia_topo(text: str) -> Topology:
    """The GPU-to-GPU matrix and NUMA affinity of `nvidia-smi topo -m`."""
    lines = [line for line in text.splitlines() if line.strip()]
    header_index = next((i for i, line in enumerate(lines) if "GPU0" in line.split()), None)
    if header_index is None:
        return Topology({}, {})
    header = [h.strip() for h in lines[header_index].strip().split("\t")]
    header = [h for h in header if h]
    links: dict[int, dict[int, str]] = {}
    numa: dict[int, int] = {}
    for line in lines[header_index + 1 :]:
        cells = [c.strip() for c in line.split("\t")]
        match = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if not match:
            continue
        row = int(match.group(1))
        values = cells[1:]
        peers: dict[int, str] = {}
        for column, value in zip(header, values, strict=False):
            peer = re.fullmatch(r"GPU(\d+)", column)
            if peer and int(peer.group(1)) != row:
                peers[int(peer.group(1))] = _topo_link(value)
            elif column == "NUMA Affinity" and value.isdigit():
                numa[row] = int(value)
        links[row] = peers
    return Topology(links, numa)


def _topo_link(value: str) -> str:
    if value.startswith("NV"):
        return "nvlink"
    return _TOPO_LINKS.get(value, "sys")


def nvidia_devices(query: str, topo: str) -> tuple[GpuDevice, ...]:
    topology = parse_nvidia_topo(topo)
    return tuple(
        GpuDevice(
            index=gpu.index,
            vendor="nvidia",
            model=nvidia_model(gpu.name),
            memory_mb=gpu.memory_mb,
            numa=topology.numa.get(gpu.index, 0),
            pci=gpu.pci,
            uuid=gpu.uuid,
            links=tuple(sorted(topology.links.get(gpu.index, {}).items())),
        )
        for gpu in parse_nvidia_query(query)
    )


def _short_pci(bus_id: str) -> str:
    """nvidia-smi prints an 8-digit domain (00000000:18:00.0); sysfs and amd-smi use 4."""
    domain, sep, rest = bus_id.lower().partition(":")
    if not sep:
        return bus_id.lower()
    return f"{int(domain, 16):04x}:{rest}"


# -- AMD (sysfs) --------------------------------------------------------------------------

AMD_VENDOR_ID = "0x1002"
AMD_MODELS = {
    "0x74a1": "mi300x",
    "0x74a5": "mi325x",
    "0x74a0": "mi300a",
    "0x740c": "mi250x",
    "0x740f": "mi210",
    "0x738c": "mi100",
}


def amd_devices(drm: Path = Path("/sys/class/drm")) -> tuple[GpuDevice, ...]:
    """Discrete AMD GPUs from sysfs, in PCI order (the order ROCr enumerates them).

    Links are reported as PCIe: telling xGMI peers apart needs the KFD topology's
    io_links, which is left for when a real MI300X node is at hand to test against.
    """
    found: list[tuple[str, str, int, int]] = []
    for card in sorted(drm.glob("card[0-9]*")):
        device = card / "device"
        if "-" in card.name or _read(device / "vendor") != AMD_VENDOR_ID:
            continue
        vram = _read(device / "mem_info_vram_total")
        if not vram.isdigit():
            continue  # an APU's or display function's node, not a compute GPU
        pci = device.resolve().name.lower()
        numa = _read(device / "numa_node")
        found.append((pci, _read(device / "device"), int(vram), max(int(numa or 0), 0)))
    found.sort()
    return tuple(
        GpuDevice(
            index=i,
            vendor="amd",
            model=AMD_MODELS.get(device_id, f"amd-{device_id.removeprefix('0x')}"),
            memory_mb=vram // (1024 * 1024),
            numa=numa,
            pci=pci,
            links=tuple((peer, "pcie") for peer in range(len(found)) if peer != i),
        )
        for i, (pci, device_id, vram, numa) in enumerate(found)
    )


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


# -- the node ---------------------------------------------------------------------------


def _run(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30).stdout


def discover_gpus(devices: str, *, node: str, run: Runner = _run) -> tuple[GpuDevice, ...]:
    """GPUs for the `devices` setting: `sim:<profile>`, `auto` or `none`."""
    if devices.startswith("sim:"):
        return simulated_gpus(devices.removeprefix("sim:"), node=node)
    if devices == "none":
        return ()
    if devices != "auto":
        raise ValueError(f"devices must be 'auto', 'none' or sim:<profile>, not {devices!r}")
    if shutil.which("nvidia-smi"):
        try:
            query = run(NVIDIA_QUERY)
            try:
                topo = run(NVIDIA_TOPO)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("nvidia-smi topo failed (%s): GPU links unknown", exc)
                topo = ""
            gpus = nvidia_devices(query, topo)
            if gpus:
                return gpus
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            log.warning("nvidia-smi failed (%s); looking for other GPUs", exc)
    gpus = amd_devices()
    if not gpus:
        log.info("no GPUs found: this node offers CPUs only")
    return gpus


def discover_node(
    *,
    name: str,
    agent_url: str,
    devices: str,
    run: Runner = _run,
    host: HostFacts | None = None,
) -> NodeSpec:
    gpus = discover_gpus(devices, node=name, run=run)
    simulated = devices.startswith("sim:")
    if host is None:
        host = SIM_PROFILES[devices.removeprefix("sim:")].host if simulated else discover_host()
    labels: Mapping[str, str] = {
        "devices": devices,
        "simulated": "true" if simulated else "false",
        "kernel": platform.release(),
    }
    return NodeSpec(
        name=name,
        cpus=host.cpus,
        memory_mb=host.memory_mb,
        agent_url=agent_url,
        sockets=host.sockets,
        cores_per_socket=host.cores_per_socket,
        threads_per_core=host.threads_per_core,
        gpus=gpus,
        features=tuple(sorted({g.model for g in gpus} | {g.vendor for g in gpus})),
        labels=tuple(sorted(labels.items())),
        # Real hosts: split evenly over the GPUs' NUMA nodes until sysfs is read here.
        numa_cpus=numa_cpus(host) if simulated else (),
    )
