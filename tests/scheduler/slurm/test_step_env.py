"""A step task's environment (scheduler/slurm/jobenv.py `step_environment`), against the
srun step of a two-node Slurm 22.05 job (reference/slurm-golden/51_env_2node_srun.txt),
and the block layout of ranks over nodes."""

from __future__ import annotations

from typing import Any

from scheduler.slurm.jobenv import step_environment, step_layout
from tests.scheduler.slurm.golden import capture, differs
from tests.scheduler.slurm.test_jobenv import NOT_FROM_THE_JOB, shown

ENV_2NODE = ("51_env_2node_srun.txt", "cat env_2node.out")
# What srun and slurmstepd put in a task's environment about themselves: how they talk
# (ports, addresses), how srun was asked to print and lay out, the umask it ran under.
SRUN_OWN = {
    "SLURM_DISTRIBUTION",
    "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0",
    "SLURM_LABELIO",
    "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_SRUN_COMM_HOST",
    "SLURM_SRUN_COMM_PORT",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_UMASK",
}


def two_node_job() -> dict[str, Any]:
    return {
        "job_id": 26,
        "name": "env2n",
        "nodes": ["gpu01", "gpu02"],
        "allocation": {"gpu01": {"cpus": 1, "gpus": [4, 5]}, "gpu02": {"cpus": 1, "gpus": [0, 1]}},
        "partition": "gpu",
        "account": "root",
        "user": "root",
        "attempt": 1,
        "spec": {"ntasks": 1, "submit_dir": "/home/alice/work"},
    }


def golden_task(rank: int) -> dict[str, str]:
    out = capture(*ENV_2NODE).stdout
    prefix = f"{rank}: "
    lines = [line[len(prefix) :] for line in out.splitlines() if line.startswith(prefix)]
    return dict(line.split("=", 1) for line in lines)


def env_of(rank: int, node: str, gpus: list[int], submit_host: str = "") -> dict[str, str]:
    return step_environment(
        two_node_job(),
        node,
        step_id=0,
        step_nodes=["gpu01", "gpu02"],
        tasks_on_nodes=[1, 1],
        rank=rank,
        local_id=0,
        node_ranks=[rank],
        gpus=gpus,
        cluster_name="slurmpeer",
        submit_host=submit_host,
    )


def test_each_task_of_a_two_node_step_sees_what_slurms_did() -> None:
    keys = [
        "SLURM_STEP_ID",
        "SLURM_STEPID",
        "SLURM_STEP_NODELIST",
        "SLURM_STEP_NUM_NODES",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_GTIDS",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_STEP_GPUS",
        "SLURM_JOB_GPUS",
        "SLURM_GPUS_ON_NODE",
        "CUDA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "SLURM_JOB_ID",
        "SLURM_JOB_NODELIST",
        "SLURMD_NODENAME",
        "SLURM_TASKS_PER_NODE",
    ]
    for rank, node, gpus in ((0, "gpu01", [4, 5]), (1, "gpu02", [0, 1])):
        golden = golden_task(rank)
        ours = env_of(rank, node, gpus)
        assert {k: ours[k] for k in keys} == {k: golden[k] for k in keys}, rank
    assert env_of(1, "gpu02", [0, 1])["RANK"] == "1"
    assert env_of(1, "gpu02", [0, 1])["WORLD_SIZE"] == "2"


@differs(ENV_2NODE)
def test_a_tasks_whole_environment_is_slurms_but_for_what_slurm_says_of_itself() -> None:
    for rank, node, gpus in ((0, "gpu01", [4, 5]), (1, "gpu02", [0, 1])):
        golden = golden_task(rank)
        ours = shown(env_of(rank, node, gpus, submit_host="vm"))
        assert {k for k in golden if ours.get(k) != golden[k]} == NOT_FROM_THE_JOB | SRUN_OWN
        assert set(ours) - set(golden) == {"HIP_VISIBLE_DEVICES", "SLURM_RESTART_COUNT"}


def test_gpus_per_task_gives_each_task_its_own_and_the_job_keeps_its_own() -> None:
    env = step_environment(
        two_node_job(),
        "gpu01",
        step_id=3,
        step_nodes=["gpu01"],
        tasks_on_nodes=[2],
        rank=1,
        local_id=1,
        node_ranks=[0, 1],
        gpus=[5],
        cluster_name="c",
    )
    assert (env["SLURM_STEP_GPUS"], env["CUDA_VISIBLE_DEVICES"]) == ("5", "5")
    assert (env["SLURM_JOB_GPUS"], env["SLURM_GPUS_ON_NODE"]) == ("4,5", "2")
    assert (env["SLURM_LOCALID"], env["SLURM_GTIDS"], env["LOCAL_WORLD_SIZE"]) == ("1", "0,1", "2")
    # In a container only the job's devices exist, numbered from 0.
    contained = step_environment(
        two_node_job(),
        "gpu01",
        step_id=3,
        step_nodes=["gpu01"],
        tasks_on_nodes=[2],
        rank=1,
        local_id=1,
        node_ranks=[0, 1],
        gpus=[5],
        cluster_name="c",
        container=True,
    )
    assert contained["CUDA_VISIBLE_DEVICES"] == "1"


def test_ranks_are_laid_out_in_blocks() -> None:
    assert step_layout(5, ["a", "b"]) == [[0, 1, 2], [3, 4]]
    assert step_layout(2, ["a", "b"]) == [[0], [1]]
