"""CDI specs for the node's GPUs."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from agents.cdi import cdi_device_names, cdi_spec, device_nodes, read_cdi_spec, write_cdi_spec
from agents.devices import simulated_gpus


def test_an_amd_spec_has_a_render_node_per_gpu_and_kfd_for_all() -> None:
    spec = cdi_spec(simulated_gpus("mi300x-8"))
    assert spec["cdiVersion"] == "0.6.0"
    assert spec["kind"] == "amd.com/gpu"
    assert [d["name"] for d in spec["devices"]] == [str(i) for i in range(8)]
    assert spec["devices"][3]["containerEdits"]["deviceNodes"] == [{"path": "/dev/dri/renderD131"}]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/kfd"}]
    assert all("=" in e for d in spec["devices"] for e in d["containerEdits"]["env"])


def test_an_nvidia_spec_has_a_device_node_per_gpu_and_the_control_nodes_for_all() -> None:
    spec = cdi_spec(simulated_gpus("h100-8"))
    assert spec["kind"] == "nvidia.com/gpu"
    assert spec["devices"][5]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia5"}]
    paths = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia-uvm"]


def test_device_names_are_fully_qualified() -> None:
    assert cdi_device_names("nvidia", [0, 3]) == ["nvidia.com/gpu=0", "nvidia.com/gpu=3"]
    assert cdi_device_names("amd", [7]) == ["amd.com/gpu=7"]
    with pytest.raises(ValueError):
        cdi_device_names("intel", [0])


def test_the_spec_is_written_as_json_under_the_spool(tmp_path: Path) -> None:
    path = write_cdi_spec(tmp_path, simulated_gpus("mi300x-8"))
    assert path == tmp_path / "cdi" / "amd-gpu.json"
    assert json.loads(path.read_text()) == cdi_spec(simulated_gpus("mi300x-8"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == ["amd-gpu.json"]
    assert write_cdi_spec(tmp_path, ()) is None


def test_a_jobs_device_nodes_are_its_gpus_and_the_shared_ones() -> None:
    spec = cdi_spec(simulated_gpus("h100-8"))
    assert device_nodes(spec, [2, 5]) == [
        ("/dev/nvidia2", "/dev/nvidia2"),
        ("/dev/nvidia5", "/dev/nvidia5"),
        ("/dev/nvidiactl", "/dev/nvidiactl"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
    ]
    assert device_nodes(spec, []) == []
    assert device_nodes(spec, [42]) == [(p, p) for p in ("/dev/nvidiactl", "/dev/nvidia-uvm")]
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = "/opt/fake/nvidia0"
    assert device_nodes(spec, [0])[0] == ("/opt/fake/nvidia0", "/dev/nvidia0")
    assert read_cdi_spec(None) == {} and read_cdi_spec("/nonexistent/spec.json") == {}
