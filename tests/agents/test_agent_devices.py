"""Device discovery: simulated profiles, and parsers checked against captured tool output."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agents.devices import (
    NVIDIA_QUERY,
    NVIDIA_TOPO,
    amd_devices,
    discover_gpus,
    discover_node,
    nvidia_devices,
    nvidia_model,
    parse_cpuinfo,
    parse_meminfo,
    parse_nvidia_query,
    parse_nvidia_topo,
    simulated_gpus,
)
from scheduler.core.resources import NodeSpec

# `nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id,uuid --format=csv,noheader,nounits`
# on an HGX H100 node.
H100_QUERY = """\
0, NVIDIA H100 80GB HBM3, 81559, 00000000:18:00.0, GPU-6c2bc9b4-5a5a-1b4f-3bd6-6d6a3f5ea2b1
1, NVIDIA H100 80GB HBM3, 81559, 00000000:2A:00.0, GPU-0d8f2c55-61a1-63c4-9d3c-0bba5a53f3c2
2, NVIDIA H100 80GB HBM3, 81559, 00000000:3A:00.0, GPU-2f2a0f0e-e2f6-1c2e-5c74-35f3b2e1f9a3
3, NVIDIA H100 80GB HBM3, 81559, 00000000:5D:00.0, GPU-9e4b1b8e-08f4-55f1-0b2f-1b9f1f5c8d44
4, NVIDIA H100 80GB HBM3, 81559, 00000000:9A:00.0, GPU-1a7c6e93-3c37-6f4d-8b55-cb8f3a5d2f65
5, NVIDIA H100 80GB HBM3, 81559, 00000000:AB:00.0, GPU-5b1d4c12-4d6e-7a8b-9c0d-1e2f3a4b5c66
6, NVIDIA H100 80GB HBM3, 81559, 00000000:BA:00.0, GPU-7c8d9e0f-1a2b-3c4d-5e6f-7a8b9c0d1e77
7, NVIDIA H100 80GB HBM3, 81559, 00000000:DB:00.0, GPU-8d9e0f1a-2b3c-4d5e-6f7a-8b9c0d1e2f88
"""

# `nvidia-smi topo -m` on the same node (columns are tab-separated).
_ROW = "GPU{i}\t" + "\t".join(f"{{c{j}}}" for j in range(8)) + "\tPXB\t{cpus}\t{numa}\t\tN/A"
H100_TOPO = (
    "\t"
    + "\t".join(f"GPU{j}" for j in range(8))
    + "\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    + "\n".join(
        _ROW.format(
            i=i,
            cpus="0-55,112-167" if i < 4 else "56-111,168-223",
            numa=0 if i < 4 else 1,
            **{f"c{j}": (" X " if i == j else "NV18") for j in range(8)},
        )
        for i in range(8)
    )
    + "\nNIC0\tPXB\tPXB\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \n\n"
    "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP "
    "interconnect between NUMA nodes\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
)

# A PCIe workstation: two GPUs behind the host bridge, no NVLink.
PCIE_TOPO = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tPHB\t0-15\t0\t\tN/A
GPU1\tPHB\t X \t0-15\t0\t\tN/A

Legend:
  X    = Self
"""

CPUINFO_2S = "\n\n".join(
    f"processor\t: {p}\nvendor_id\t: GenuineIntel\nphysical id\t: {p // 4}\n"
    f"core id\t\t: {(p % 4) // 2}\ncpu cores\t: 2\n"
    for p in range(8)
)

MEMINFO = "MemTotal:       263862340 kB\nMemFree:        200000000 kB\n"


def test_the_mi300x_profile_is_one_xgmi_hive_of_eight_on_two_numa_nodes() -> None:
    gpus = simulated_gpus("mi300x-8", node="sim01")
    assert len(gpus) == 8
    assert {(g.vendor, g.model, g.memory_mb) for g in gpus} == {("amd", "mi300x", 196608)}
    assert [g.numa for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    for gpu in gpus:
        assert dict(gpu.links) == {p: "xgmi" for p in range(8) if p != gpu.index}
        assert gpu.pci.startswith("0000:") and gpu.pci.endswith(":00.0")
    assert len({g.pci for g in gpus}) == 8


def test_the_h100_profile_has_nvlink_between_every_pair() -> None:
    gpus = simulated_gpus("h100-8")
    assert {(g.vendor, g.model, g.memory_mb) for g in gpus} == {("nvidia", "h100", 81920)}
    assert all(kind == "nvlink" for g in gpus for _, kind in g.links)
    assert [g.numa for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_simulated_node_round_trips_as_a_nodespec() -> None:
    node = discover_node(name="sim01", agent_url="http://127.0.0.1:6818", devices="sim:h100-8")
    assert NodeSpec.from_dict(node.to_dict()) == node
    assert node.cpus == node.sockets * node.cores_per_socket * node.threads_per_core
    assert "h100" in node.features


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="sim:mi300x-8"):
        simulated_gpus("tpu-4")


def test_nvidia_smi_query_output_is_parsed() -> None:
    gpus = parse_nvidia_query(H100_QUERY)
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[1].pci == "0000:2a:00.0"
    assert gpus[0].memory_mb == 81559
    assert gpus[7].uuid.startswith("GPU-8d9e")


def test_nvidia_model_names_are_shortened_to_what_gres_types_use() -> None:
    assert nvidia_model("NVIDIA H100 80GB HBM3") == "h100"
    assert nvidia_model("NVIDIA A100-SXM4-80GB") == "a100"
    assert nvidia_model("Tesla V100-SXM2-16GB") == "v100"
    assert nvidia_model("NVIDIA H200") == "h200"
    assert nvidia_model("NVIDIA GeForce RTX 4090") == "rtx4090"


def test_nvidia_topology_gives_links_and_numa_affinity() -> None:
    topology = parse_nvidia_topo(H100_TOPO)
    assert topology.links[0] == {p: "nvlink" for p in range(1, 8)}
    assert topology.numa == {i: (0 if i < 4 else 1) for i in range(8)}
    pcie = parse_nvidia_topo(PCIE_TOPO)
    assert pcie.links == {0: {1: "pcie"}, 1: {0: "pcie"}}


def test_nvidia_devices_combine_query_and_topology() -> None:
    gpus = nvidia_devices(H100_QUERY, H100_TOPO)
    assert gpus[5].numa == 1
    assert gpus[5].model == "h100"
    assert dict(gpus[5].links)[0] == "nvlink"
    assert nvidia_devices(H100_QUERY, "")[3].links == ()


def test_auto_discovery_runs_nvidia_smi_when_it_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agents.devices.shutil.which", lambda name: "/usr/bin/" + name)
    outputs = {tuple(NVIDIA_QUERY): H100_QUERY, tuple(NVIDIA_TOPO): H100_TOPO}

    def run(argv: Sequence[str]) -> str:
        return outputs[tuple(argv)]

    gpus = discover_gpus("auto", node="n1", run=run)
    assert len(gpus) == 8


def test_auto_discovery_without_gpu_tools_finds_no_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("agents.devices.shutil.which", lambda name: None)
    monkeypatch.setattr("agents.devices.amd_devices", lambda: ())
    assert discover_gpus("auto", node="n1") == ()


def test_amd_gpus_are_found_in_sysfs_in_pci_order(tmp_path: Path) -> None:
    for card, bus, numa in [("card1", "0000:22:00.0", "0"), ("card0", "0000:9f:00.0", "1")]:
        device = tmp_path / "devices" / bus
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x1002\n")
        (device / "device").write_text("0x74a1\n")
        (device / "mem_info_vram_total").write_text(str(192 * 1024**3) + "\n")
        (device / "numa_node").write_text(numa + "\n")
        (tmp_path / "drm" / card).mkdir(parents=True)
        (tmp_path / "drm" / card / "device").symlink_to(device)
    (tmp_path / "drm" / "card0-DP-1").mkdir()
    gpus = amd_devices(tmp_path / "drm")
    assert [(g.index, g.pci, g.numa, g.model) for g in gpus] == [
        (0, "0000:22:00.0", 0, "mi300x"),
        (1, "0000:9f:00.0", 1, "mi300x"),
    ]
    assert gpus[0].memory_mb == 192 * 1024


def test_cpuinfo_gives_sockets_cores_and_threads() -> None:
    facts = parse_cpuinfo(CPUINFO_2S)
    assert (facts.cpus, facts.sockets, facts.cores_per_socket, facts.threads_per_core) == (
        8,
        2,
        2,
        2,
    )


def test_meminfo_gives_megabytes() -> None:
    assert parse_meminfo(MEMINFO) == 263862340 // 1024
    with pytest.raises(ValueError):
        parse_meminfo("nothing here")
