"""The batch step's environment, checked against a real Slurm 22.05 job's (golden files)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduler.slurm.jobenv import job_environment, master_port, run_length, tasks_per_node
from tests.scheduler.slurm.golden import capture, differs

# `env | grep -E '^(SLURM|CUDA|ROCR|GPU|HIP)' | sort` in the batch step of
# `sbatch -J env2 --gres=gpu:2` on gpu01.
GPU2 = ("50_env_gpu2.txt", "cat env_gpu2.out")
SHOWN = re.compile(r"^(SLURM|CUDA|ROCR|GPU|HIP)")  # what the captures' `grep -E` keeps
# Set by us where Slurm sets none: every task's count and GPUs, HIP's devices.
OURS_ONLY = {"HIP_VISIBLE_DEVICES", "SLURM_NPROCS", "SLURM_NTASKS", "SLURM_RESTART_COUNT",
             "SLURM_STEP_GPUS"}  # fmt: skip

# The batch step of `sbatch -J env2n -N2 --gres=gpu:2` (51_env_2node_srun.txt), as far
# as it differs from the one above.
GOLDEN_2NODE = {
    "CUDA_VISIBLE_DEVICES": "4,5",
    "SLURM_JOB_CPUS_PER_NODE": "1(x2)",
    "SLURM_JOB_GPUS": "4,5",
    "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_NODELIST": "gpu[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}

# Set by slurmd from its own configuration, or only knowable inside the process
# (SLURM_TASK_PID); the agent launcher adds the uid/gid ones.
NOT_FROM_THE_JOB = {
    "SLURM_CONF",
    "SLURM_JOB_GID",
    "SLURM_JOB_UID",
    "SLURM_MEM_PER_CPU",
    "SLURM_NODE_ALIASES",
    "SLURM_PRIO_PROCESS",
    "SLURM_TASK_PID",
    "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN",
    "SLURM_WORKING_CLUSTER",
}


def _golden(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def _job(**overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "job_id": 25,
        "name": "env2",
        "user": "root",
        "account": "root",
        "partition": "gpu",
        "qos": "normal",
        "nodes": ["gpu01"],
        "allocation": {"gpu01": {"gpus": [2, 3], "cpus": 1, "mem_mb": 8192}},
        "attempt": 1,
        "workdir": "/home/alice/work",
        "spec": {"script": "#!/bin/sh\n", "name": "env2", "workdir": "/home/alice/work"},
    }
    job.update(overrides)
    return job


def shown(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if SHOWN.match(k)}


def differing(golden: dict[str, str], ours: dict[str, str]) -> set[str]:
    return {k for k in golden if ours.get(k) != golden[k]}


@differs(GPU2)
def test_it_sets_every_variable_slurm_sets_from_the_job_with_the_same_values() -> None:
    golden = _golden(capture(*GPU2).stdout)
    env = job_environment(_job(), "gpu01", cluster_name="slurmpeer", submit_host="vm")
    # Equal but for what slurmd knows of itself, and what we add.
    assert differing(golden, shown(env)) == NOT_FROM_THE_JOB
    assert set(shown(env)) - set(golden) == OURS_ONLY


def test_the_first_node_of_a_two_node_job_matches_slurms_batch_step() -> None:
    job = _job(
        job_id=26,
        name="env2n",
        nodes=["gpu01", "gpu02"],
        allocation={
            "gpu01": {"gpus": [4, 5], "cpus": 1, "mem_mb": 8192},
            "gpu02": {"gpus": [0, 1], "cpus": 1, "mem_mb": 8192},
        },
    )
    env = job_environment(job, "gpu01", cluster_name="slurmpeer", submit_host="vm")
    expected = {**_golden(capture(*GPU2).stdout), **GOLDEN_2NODE, "SLURM_JOB_ID": "26",
                "SLURM_JOBID": "26"}  # fmt: skip
    expected["SLURM_JOB_NAME"] = "env2n"
    expected["GPU_DEVICE_ORDINAL"] = expected["ROCR_VISIBLE_DEVICES"] = "4,5"
    for key, value in expected.items():
        if key not in NOT_FROM_THE_JOB:
            assert env.get(key) == value, key
    assert env["SLURM_NTASKS"] == "2"


def test_the_second_node_sees_its_own_node_id_and_gpus() -> None:
    job = _job(
        nodes=["gpu01", "gpu02"],
        allocation={
            "gpu01": {"gpus": [4, 5], "cpus": 72, "mem_mb": 1},
            "gpu02": {"gpus": [0, 1], "cpus": 72, "mem_mb": 1},
        },
    )
    env = job_environment(job, "gpu02", cluster_name="c")
    assert env["SLURM_NODEID"] == "1"
    assert env["NODE_RANK"] == "1"
    assert env["SLURMD_NODENAME"] == "gpu02"
    assert env["SLURM_JOB_GPUS"] == "0,1"
    assert env["MASTER_ADDR"] == "gpu01"
    assert env["SLURM_JOB_CPUS_PER_NODE"] == "72(x2)"


@differs(("52_env_gpus_option.txt", "cat env_gpus3.out"))
def test_a_job_given_gpus_with_the_gpus_option_sees_what_slurms_did() -> None:
    golden = _golden(capture("52_env_gpus_option.txt", "cat env_gpus3.out").stdout)
    job = _job(job_id=27, name="envgpus", nodes=["gpu02"],
               allocation={"gpu02": {"gpus": [2, 3, 4], "cpus": 1, "mem_mb": 8192}},
               spec={"script": "#!/bin/sh\n", "gpus": 3})  # fmt: skip
    env = shown(job_environment(job, "gpu02", cluster_name="slurmpeer", submit_host="vm"))
    assert differing(golden, env) == NOT_FROM_THE_JOB
    assert set(env) - set(golden) == OURS_ONLY


def test_a_job_given_gpus_with_the_gpus_option_gets_slurm_gpus() -> None:
    spec = {"script": "#!/bin/sh\n", "gpus": 3}
    job = _job(spec=spec, allocation={"gpu01": {"gpus": [2, 3, 4], "cpus": 1, "mem_mb": 1}})
    env = job_environment(job, "gpu01", cluster_name="c")
    assert env["SLURM_GPUS"] == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3,4"
    assert env["SLURM_GPUS_ON_NODE"] == "3"


def test_variables_slurm_sets_only_on_request_are_absent_by_default() -> None:
    env = job_environment(_job(), "gpu01", cluster_name="c")
    assert "SLURM_GPUS" not in env
    assert "SLURM_CPUS_PER_TASK" not in env


def test_cpus_per_task_is_set_when_asked_for() -> None:
    job = _job(spec={"script": "#!/bin/sh\n", "cpus_per_task": 8})
    assert job_environment(job, "gpu01", cluster_name="c")["SLURM_CPUS_PER_TASK"] == "8"


def test_a_job_without_gpus_is_hidden_from_every_gpu() -> None:
    job = _job(allocation={"gpu01": {"gpus": [], "cpus": 4, "mem_mb": 1}})
    env = job_environment(job, "gpu01", cluster_name="c")
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    # ROCr reads an empty list as "all devices": an invalid index hides them instead.
    assert env["ROCR_VISIBLE_DEVICES"] == "-1"
    assert env["HIP_VISIBLE_DEVICES"] == "-1"
    assert env["GPU_DEVICE_ORDINAL"] == "-1"
    assert "SLURM_JOB_GPUS" not in env


def test_inside_a_container_the_devices_are_numbered_from_zero() -> None:
    env = job_environment(_job(), "gpu01", cluster_name="c", container=True)
    for key in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        assert env[key] == "0,1"
    assert env["SLURM_JOB_GPUS"] == "2,3"


def test_on_amd_hip_counts_within_what_rocr_exposes() -> None:
    env = job_environment(_job(), "gpu01", cluster_name="c", gpu_vendor="amd")
    assert env["ROCR_VISIBLE_DEVICES"] == "2,3"
    assert env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["GPU_DEVICE_ORDINAL"] == "0,1"


def test_distributed_training_variables_describe_task_zero() -> None:
    job = _job(
        job_id=1234,
        nodes=["n1", "n2", "n3"],
        allocation={n: {"gpus": [0], "cpus": 2, "mem_mb": 1} for n in ("n1", "n2", "n3")},
        spec={"script": "#!/bin/sh\n", "ntasks": 5},
    )
    env = job_environment(job, "n1", cluster_name="c")
    assert env["MASTER_ADDR"] == "n1"
    assert env["MASTER_PORT"] == str(master_port(1234)) == "21234"
    assert env["WORLD_SIZE"] == "5"
    assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"]) == ("0", "0", "0")
    assert env["LOCAL_WORLD_SIZE"] == "2"
    assert env["SLURM_TASKS_PER_NODE"] == "2(x2),1"
    assert env["SLURM_JOB_NODELIST"] == "n[1-3]"


def test_the_restart_count_is_the_attempt_before_this_one() -> None:
    assert job_environment(_job(attempt=3), "gpu01", cluster_name="c")["SLURM_RESTART_COUNT"] == "2"
    assert job_environment(_job(attempt=0), "gpu01", cluster_name="c")["SLURM_RESTART_COUNT"] == "0"


def test_a_node_outside_the_job_is_an_error() -> None:
    with pytest.raises(ValueError):
        job_environment(_job(), "gpu09", cluster_name="c")


def test_run_length_compresses_equal_neighbours_like_slurm() -> None:
    assert run_length([72, 72, 36]) == "72(x2),36"
    assert run_length([1]) == "1"
    assert run_length([2, 1, 1, 2]) == "2,1(x2),2"


def test_tasks_are_spread_in_blocks_with_the_remainder_first() -> None:
    assert tasks_per_node(7, 3) == [3, 2, 2]
    assert tasks_per_node(1, 2) == [1, 1]


def test_an_array_task_sees_its_array_variables():
    from scheduler.slurm.jobenv import job_environment

    job = {
        "job_id": 42,
        "nodes": ["n1"],
        "allocation": {"n1": {"gpus": [], "cpus": 1, "mem_mb": 1}},
        "array_job_id": 40,
        "array_task_id": 4,
        "spec": {"array": "0-8:2%2"},
    }
    env = job_environment(job, "n1", cluster_name="c")
    assert {k: v for k, v in env.items() if k.startswith("SLURM_ARRAY")} == {
        "SLURM_ARRAY_JOB_ID": "40",
        "SLURM_ARRAY_TASK_ID": "4",
        "SLURM_ARRAY_TASK_COUNT": "5",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "8",
        "SLURM_ARRAY_TASK_STEP": "2",
    }
    del job["array_job_id"], job["array_task_id"]
    assert not [k for k in job_environment(job, "n1", cluster_name="c") if "ARRAY" in k]
