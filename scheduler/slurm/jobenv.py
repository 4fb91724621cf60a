"""The environment of a batch step: Slurm's variables plus the device and launcher ones.

Built from the job dict of docs/architecture.md (the launch payload's `job`, with `spec`)
for the node the step runs on. Pure: no clock, no I/O, so the agent, `srun` and tests
all get the same answer for the same job.

Choices where Slurm leaves room (each tested in tests/scheduler/slurm/test_jobenv.py):

- Device indices. A plain process (no container, no device cgroup) sees every GPU of the
  node, so its visible-device lists name the node's own indices, as Slurm does without
  `ConstrainDevices` (the golden file shows `CUDA_VISIBLE_DEVICES=2,3` for GPUs 2,3).
  Inside a CDI container only the job's devices exist, numbered 0..n-1: `container=True`.
- AMD. ROCr applies `ROCR_VISIBLE_DEVICES` first; HIP (`HIP_VISIBLE_DEVICES`, and
  `CUDA_VISIBLE_DEVICES`, which HIP reads as an alias) and OpenCL (`GPU_DEVICE_ORDINAL`)
  then index into what ROCr left. Slurm sets all of them to the node indices, which
  leaves a HIP program on GPUs 2,3 looking for devices 2 and 3 among two: none. So on
  AMD nodes ROCr gets the node indices and the others 0..n-1 (the same devices).
- No GPUs. Slurm leaves the variables unset and the process then sees every GPU of the
  node, including other tenants'. We hide them instead: `CUDA_VISIBLE_DEVICES=""`
  (CUDA documents an empty list as "no devices"), and `-1` for the ROCm variables,
  because ROCr reads an empty `ROCR_VISIBLE_DEVICES` as unset (all devices) while an
  invalid first index ends the list for ROCr, HIP and OpenCL alike. Failing closed is
  the point: a job that asked for no GPU must not get one by accident.
- `MASTER_PORT` is `20000 + job_id % 10000`: every node computes it without talking to
  the others, it lies below Linux's ephemeral range (32768+) so no outgoing connection
  holds it, and two jobs sharing a first node collide only if their ids are 10000 apart.
- The batch step is task 0 of the job: `RANK=0`, `LOCAL_RANK=0`, `WORLD_SIZE=ntasks`;
  steps launched by `srun` set their own per task.
- `SLURM_NTASKS` is always set: the job dict cannot tell `-n1` from no `-n` (Slurm sets
  it only for the former), and launchers read it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import hostlist

from scheduler.core.arrays import parse_array
from scheduler.core.errors import Rejected

MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 10000

# Visible-device variables, in the order their values are computed below.
GPU_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)
HIDE_ALL_GPUS: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "",
    "ROCR_VISIBLE_DEVICES": "-1",
    "HIP_VISIBLE_DEVICES": "-1",
    "GPU_DEVICE_ORDINAL": "-1",
}


def job_environment(
    job: Mapping[str, Any],
    node: str,
    *,
    cluster_name: str,
    submit_host: str = "",
    container: bool = False,
    gpu_vendor: str = "",
) -> dict[str, str]:
    """Variables for the batch step of `job` on `node` (which must be one of its nodes).

    `gpu_vendor` is the vendor of the node's GPUs ("amd", "nvidia" or "" for unknown,
    treated like NVIDIA); the job dict does not carry it, the agent knows it.
    """
    nodes = [str(n) for n in job.get("nodes") or ()]
    if node not in nodes:
        raise ValueError(f"node {node!r} is not in the job's nodes {nodes}")
    spec: Mapping[str, Any] = job.get("spec") or {}
    allocation: Mapping[str, Mapping[str, Any]] = job.get("allocation") or {}
    job_id = int(job["job_id"])
    node_id = nodes.index(node)
    # Slurm runs at least one task per node when -n is smaller than -N (or not given).
    ntasks = max(int(spec.get("ntasks", 1)), len(nodes))
    cpus = [int(allocation.get(n, {}).get("cpus", 1)) for n in nodes]
    tasks = tasks_per_node(ntasks, len(nodes))
    gpus = [int(g) for g in allocation.get(node, {}).get("gpus", ())]
    nodelist = hostlist.collect_hostlist(nodes)
    submit_dir = str(spec.get("submit_dir") or job.get("workdir") or spec.get("workdir") or "/")

    env: dict[str, str] = {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_NAME": str(job.get("name") or spec.get("name") or "sbatch"),
        "SLURM_JOB_NUM_NODES": str(len(nodes)),
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_JOB_CPUS_PER_NODE": run_length(cpus),
        "SLURM_TASKS_PER_NODE": run_length(tasks),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_GTIDS": "0",
        "SLURM_NODEID": str(node_id),
        "SLURM_CPUS_ON_NODE": str(cpus[node_id]),
        "SLURM_JOB_PARTITION": str(job.get("partition") or spec.get("partition") or ""),
        "SLURM_JOB_ACCOUNT": str(job.get("account") or spec.get("account") or ""),
        "SLURM_JOB_QOS": str(job.get("qos") or spec.get("qos") or "normal"),
        "SLURM_JOB_USER": str(job.get("user") or spec.get("user") or ""),
        "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_SUBMIT_HOST": submit_host or str(spec.get("submit_host") or ""),
        "SLURM_CLUSTER_NAME": cluster_name,
        "SLURMD_NODENAME": node,
        "SLURM_RESTART_COUNT": str(max(int(job.get("attempt") or 0) - 1, 0)),
    }
    env.update(array_environment(job, spec))
    cpus_per_task = int(spec.get("cpus_per_task", 1))
    if cpus_per_task != 1:
        env["SLURM_CPUS_PER_TASK"] = str(cpus_per_task)
    if int(spec.get("gpus", 0)):
        env["SLURM_GPUS"] = str(int(spec["gpus"]))
    env.update(gpu_environment(gpus, container=container, vendor=gpu_vendor))
    env.update(
        {
            "MASTER_ADDR": nodes[0],
            "MASTER_PORT": str(master_port(job_id)),
            "WORLD_SIZE": str(ntasks),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(tasks[node_id]),
            "NODE_RANK": str(node_id),
        }
    )
    return env


def array_environment(job: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, str]:
    """SLURM_ARRAY_* for a task of a job array (nothing for a plain job)."""
    if job.get("array_job_id") is None or job.get("array_task_id") is None:
        return {}
    try:
        ids, _ = parse_array(str(spec.get("array") or ""))
    except Rejected:
        ids = (int(job["array_task_id"]),)
    steps = {b - a for a, b in itertools.pairwise(ids)}
    return {
        "SLURM_ARRAY_JOB_ID": str(int(job["array_job_id"])),
        "SLURM_ARRAY_TASK_ID": str(int(job["array_task_id"])),
        "SLURM_ARRAY_TASK_COUNT": str(len(ids)),
        "SLURM_ARRAY_TASK_MIN": str(min(ids)),
        "SLURM_ARRAY_TASK_MAX": str(max(ids)),
        "SLURM_ARRAY_TASK_STEP": str(steps.pop() if len(steps) == 1 else 1),
    }


def gpu_environment(gpus: Sequence[int], *, container: bool, vendor: str = "") -> dict[str, str]:
    """Slurm's GPU variables and the runtimes' visible-device lists for `gpus` (node indices)."""
    if not gpus:
        return dict(HIDE_ALL_GPUS)
    node_indices = _join(gpus)
    local = _join(range(len(gpus)))
    outer = local if container else node_indices
    # HIP and OpenCL on ROCm count within what ROCr exposes (see the module docstring).
    inner = local if container or vendor == "amd" else node_indices
    return {
        "SLURM_JOB_GPUS": node_indices,
        "SLURM_STEP_GPUS": node_indices,
        "SLURM_GPUS_ON_NODE": str(len(gpus)),
        "CUDA_VISIBLE_DEVICES": inner,
        "ROCR_VISIBLE_DEVICES": outer,
        "HIP_VISIBLE_DEVICES": inner,
        "GPU_DEVICE_ORDINAL": inner,
    }


def master_port(job_id: int) -> int:
    return MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN


def tasks_per_node(ntasks: int, num_nodes: int) -> list[int]:
    """Slurm's block distribution: the first `ntasks % num_nodes` nodes get one more."""
    if num_nodes < 1:
        return []
    base, extra = divmod(max(ntasks, num_nodes), num_nodes)
    return [base + (1 if i < extra else 0) for i in range(num_nodes)]


def run_length(values: Sequence[int]) -> str:
    """Slurm's compressed per-node counts: [72, 72, 36] -> "72(x2),36"."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        count = j - i + 1
        parts.append(f"{values[i]}(x{count})" if count > 1 else str(values[i]))
        i = j + 1
    return ",".join(parts)


def _join(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in values)


def step_environment(
    job: Mapping[str, Any],
    node: str,
    *,
    step_id: int,
    step_nodes: Sequence[str],
    tasks_on_nodes: Sequence[int],
    rank: int,
    local_id: int,
    node_ranks: Sequence[int],
    gpus: Sequence[int],
    cluster_name: str,
    submit_host: str = "",
    container: bool = False,
    gpu_vendor: str = "",
) -> dict[str, str]:
    """Variables of one task of a job step (srun), on `node`: the job's (as the batch step
    sees them there), then the step's and the task's own.

    `tasks_on_nodes` is the step's tasks per node, in `step_nodes` order; `node_ranks`
    the ranks this node runs; `gpus` the GPUs (node indices) this task sees: the node's
    GPUs of the job, or its own with --gpus-per-task.
    """
    env = job_environment(
        job,
        node,
        cluster_name=cluster_name,
        submit_host=submit_host,
        container=container,
        gpu_vendor=gpu_vendor,
    )
    node_gpus = [int(g) for g in (job.get("allocation") or {}).get(node, {}).get("gpus", ())]
    ntasks = sum(tasks_on_nodes)
    step_node_index = list(step_nodes).index(node)
    env.update(gpu_environment(list(gpus), container=container, vendor=gpu_vendor))
    first_gpus = [
        int(g) for g in (job.get("allocation") or {}).get(nodes_of(job)[0], {}).get("gpus", ())
    ]
    if first_gpus:
        # As Slurm's srun passes it on: the job's GPUs as its batch step saw them.
        env["SLURM_JOB_GPUS"] = _join(first_gpus)
    if node_gpus:
        env["SLURM_GPUS_ON_NODE"] = str(len(node_gpus))
        if container and gpus:
            # Inside a container only the job's devices exist, numbered from 0.
            local = [node_gpus.index(g) for g in gpus if g in node_gpus]
            for key in GPU_VARIABLES:
                env[key] = _join(local)
    env.update(
        {
            "SLURM_STEP_ID": str(step_id),
            "SLURM_STEPID": str(step_id),
            "SLURM_STEP_NODELIST": hostlist.collect_hostlist(list(step_nodes)),
            "SLURM_STEP_NUM_NODES": str(len(step_nodes)),
            "SLURM_STEP_NUM_TASKS": str(ntasks),
            "SLURM_STEP_TASKS_PER_NODE": run_length(list(tasks_on_nodes)),
            "SLURM_NTASKS": str(ntasks),
            "SLURM_NPROCS": str(ntasks),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(local_id),
            "SLURM_GTIDS": _join(node_ranks),
            "SLURM_DISTRIBUTION": "block",
            "RANK": str(rank),
            "LOCAL_RANK": str(local_id),
            "WORLD_SIZE": str(ntasks),
            "LOCAL_WORLD_SIZE": str(len(node_ranks)),
            "NODE_RANK": str(step_node_index),
        }
    )
    return env


def nodes_of(job: Mapping[str, Any]) -> list[str]:
    return [str(n) for n in job.get("nodes") or ()]


def step_layout(ntasks: int, nodes: Sequence[str]) -> list[list[int]]:
    """The ranks each node runs, in `nodes` order: Slurm's block distribution."""
    counts = tasks_per_node(ntasks, len(nodes))
    out: list[list[int]] = []
    first = 0
    for count in counts:
        out.append(list(range(first, first + count)))
        first += count
    return out
