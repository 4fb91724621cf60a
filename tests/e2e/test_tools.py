"""What tools that drive Slurm do, end to end, as such a tool does it: as the tenant's
Unix identity (demo.env's SPUR_JOB_USER, by `runuser -u`), from a directory of the
organisation's workspace (SPUR_WORKSPACE, the file system its jobs see), with the Slurm
commands on PATH. Every real process: web, controller, Celery worker, two agents.

The patterns are those of submitit (a batch script that sruns `python -u -m module
folder`, pickles in and out, sacct polling), dask-jobqueue and the like (squeue
polling), torchrun launchers (MASTER_ADDR from `scontrol show hostnames`), and of
people's own scripts (`sbatch --wait`, arrays with `%A_%a` outputs, `--parsable -M`,
`scontrol hold/release`, `salloc ... srun`).
"""

from __future__ import annotations

import os
import pickle
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from scheduler.core.contract import TERMINAL
from tests.fixtures.platform import Platform, api, start_platform
from tests.scheduler.slurm.golden import capture, compares

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Platform:
    # Both nodes alike, so that a two-node job can hold GPUs on each.
    yield from start_platform(tmp_path_factory.mktemp("tools"), nodes="sim01=h100-8,sim02=h100-8")


@pytest.fixture
def here(platform: Platform, request: pytest.FixtureRequest) -> Path:
    return platform.workspace_dir(re.sub(r"\W", "_", request.node.name))


def folder(here: Path, name: str) -> Path:
    """A directory beside `here`'s others, the organisation's as `here` is."""
    path = here / name
    path.mkdir()
    os.chown(path, here.stat().st_uid, here.stat().st_gid)
    return path


def ok(platform: Platform, command: str, cwd: Path, **kw) -> str:  # type: ignore[no-untyped-def]
    result = platform.as_job_user(command, cwd=cwd, **kw)
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    return result.stdout


def poll(
    platform: Platform, command: str, cwd: Path, done: Callable[[str], bool], timeout: float = 120
) -> str:
    """Run `command` as a tool does, every half second, until `done` with its output."""
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = ok(platform, command, cwd)
        if done(out):
            return out
        time.sleep(0.5)
    raise AssertionError(
        f"{command}: still {out!r} after {timeout}s\n{platform.log('worker')[-2000:]}"
    )


# The states a job is over in (COMPLETING still holds its node), from the core's contract.
OVER = frozenset(state.value for state in TERMINAL)


def finished(platform: Platform, job_id: int, cwd: Path) -> str:
    """sacct -P polling (submitit's): the job's state once it is over."""
    out = poll(
        platform,
        f"sacct -o JobID,State -P -j {job_id}",
        cwd,
        lambda out: any(
            line.startswith(f"{job_id}|") and line.split("|")[1].split()[0] in OVER
            for line in out.splitlines()
        ),
    )
    return next(line for line in out.splitlines() if line.startswith(f"{job_id}|")).split("|")[1]


# -- submitit: a batch script that sruns `python -u -m module folder`, pickles both ways ---

RUNNER = """\
import os, pickle, sys
from pathlib import Path

folder = Path(sys.argv[1])
with open(folder / "task.pkl", "rb") as handle:
    name, args = pickle.load(handle)
print("running", name, flush=True)
result = {
    "value": sum(args),
    "job": os.environ["SLURM_JOB_ID"],
    "step": os.environ.get("SLURM_STEP_ID"),
    "procid": os.environ.get("SLURM_PROCID"),
    "ntasks": os.environ.get("SLURM_NTASKS"),
    "cwd": os.getcwd(),
}
partial = folder / (os.environ["SLURM_JOB_ID"] + "_result.pkl.tmp")
with open(partial, "wb") as handle:
    pickle.dump(("success", result), handle)
partial.rename(folder / (os.environ["SLURM_JOB_ID"] + "_result.pkl"))
"""

SUBMISSION = """\
#!/bin/bash
#SBATCH --job-name=submitit
#SBATCH --output=../pickles/%j_0_log.out
#SBATCH --error=../pickles/%j_0_log.err
#SBATCH --ntasks=1
#SBATCH --time=10
export PYTHONPATH="$SLURM_SUBMIT_DIR/../lib"
srun --unbuffered --ntasks=1 python3 -u -m runner "$SLURM_SUBMIT_DIR/../pickles"
"""


def test_a_submitit_like_tool_runs_its_pickled_task_through_srun(platform, here):
    lib, pickles, submit = folder(here, "lib"), folder(here, "pickles"), folder(here, "submit")
    (lib / "runner.py").write_text(RUNNER)
    with open(pickles / "task.pkl", "wb") as handle:
        pickle.dump(("sum", [1, 2, 3]), handle)
    (submit / "submission.sh").write_text(SUBMISSION)
    job_id = int(ok(platform, "sbatch --parsable submission.sh", submit))
    assert finished(platform, job_id, submit) == "COMPLETED"
    with open(pickles / f"{job_id}_result.pkl", "rb") as handle:
        outcome, result = pickle.load(handle)
    assert (outcome, result["value"], result["job"]) == ("success", 6, str(job_id))
    assert (result["step"], result["procid"], result["ntasks"]) == ("0", "0", "1")
    assert result["cwd"] == str(submit)
    assert (pickles / f"{job_id}_0_log.out").read_text() == "running sum\n"
    # Written by the tenant's account, as everything its jobs make.
    assert (pickles / f"{job_id}_result.pkl").stat().st_uid == here.stat().st_uid
    steps = ok(platform, f"sacct -o JobID,JobName,State -P -n -j {job_id}", submit)
    assert steps.splitlines() == [
        f"{job_id}|submitit|COMPLETED",
        f"{job_id}.batch|batch|COMPLETED",
        f"{job_id}.0|python3|COMPLETED",
    ]


# -- arrays: sacct polling by task ids, outputs named %A_%a ---------------------------------


def test_an_arrays_tasks_are_polled_by_their_ids_and_write_where_asked(platform, here):
    job_id = int(
        ok(platform, "sbatch --parsable --array=0-2 -o %A_%a.out -e %A_%a.err "
           "--wrap 'echo task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID'", here)
    )  # fmt: skip
    ids = ",".join(f"{job_id}_{i}" for i in range(3))

    def all_over(out: str) -> bool:
        states = [line.split("|")[1] for line in out.splitlines()[1:] if "." not in line]
        return len(states) == 3 and all(s == "COMPLETED" for s in states)

    out = poll(platform, f"sacct -o JobID,State -P -j {ids}", here, all_over)
    assert out.splitlines() == ["JobID|State"] + [
        row
        for i in range(3)
        for row in (f"{job_id}_{i}|COMPLETED", f"{job_id}_{i}.batch|COMPLETED")
    ]
    # The array's own id names every task, as in Slurm; -X keeps the allocations.
    assert ok(platform, f"sacct -X -o JobID,State -P -n -j {job_id}", here).splitlines() == [
        f"{job_id}_{i}|COMPLETED" for i in range(3)
    ]
    for i in range(3):
        assert (here / f"{job_id}_{i}.out").read_text() == f"task {i} of {job_id}\n"
        assert (here / f"{job_id}_{i}.err").read_text() == ""
    assert not (here / f"slurm-{job_id}_0.out").exists()


# -- squeue polling --------------------------------------------------------------------------


def test_squeue_polling_sees_a_job_run_then_no_more(platform, here):
    job_id = int(ok(platform, "sbatch --parsable --wrap 'sleep 15'", here))
    command = f"squeue --noheader -o %i,%T -j {job_id}"
    poll(platform, command, here, lambda out: out == f"{job_id},RUNNING\n")
    # Over: no line, exit 0 (Slurm knows it until MinJobAge, and so do we).
    poll(platform, command, here, lambda out: out == "")
    assert finished(platform, job_id, here) == "COMPLETED"


# -- launchers: MASTER_ADDR from scontrol, srun -l over two nodes ---------------------------

LAUNCHER = """\
#!/bin/bash
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
echo "master=$MASTER_ADDR nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr '\\n' ' ')"
srun -l hostname | sort
srun -l bash -c 'echo $SLURMD_NODENAME $SLURM_NODEID' | sort
"""


def test_a_launcher_finds_its_master_and_srun_labels_one_line_per_rank(platform, here):
    (here / "launch.sh").write_text(LAUNCHER)
    job_id = int(ok(platform, "sbatch --parsable -N2 -o launch-%j.out launch.sh", here))
    assert finished(platform, job_id, here) == "COMPLETED"
    lines = (here / f"launch-{job_id}.out").read_text().splitlines()
    assert lines[0] == "master=sim01 nodes=sim01 sim02 "
    assert [line.split(": ")[0] for line in lines[1:3]] == ["0", "1"]
    assert lines[3:] == ["0: sim01 0", "1: sim02 1"]


SRUN_N2 = ("53_srun_direct.txt", "srun -N2 --gres=gpu:1 -l hostname")
SRUN_GPU = (
    "53_srun_direct.txt",
    "srun --gres=gpu:1 bash -c 'echo $SLURM_JOB_ID $CUDA_VISIBLE_DEVICES "
    "$ROCR_VISIBLE_DEVICES $SLURM_STEP_GPUS'",
)


def normal_hosts(text: str) -> str:
    """Names normalised (the captured nodes were one host, `vm`), ranks in order."""
    return "".join(sorted(re.sub(r"^(\d+): .*$", r"\1: <host>", line) + "\n"
                          for line in text.splitlines()))  # fmt: skip


@compares(SRUN_N2, SRUN_GPU)
def test_srun_outside_an_allocation_prints_what_slurms_did(platform, here):
    result = platform.as_job_user(SRUN_N2[1], cwd=here, timeout=120)
    golden = capture(*SRUN_N2)
    assert result.returncode == golden.exit_code, result.stderr
    assert (normal_hosts(result.stdout), result.stderr) == (
        normal_hosts(golden.stdout),
        golden.stderr,
    )
    result = platform.as_job_user(SRUN_GPU[1], cwd=here, timeout=120)
    golden = capture(*SRUN_GPU)
    # The job id and the GPU's index normalised: `29 2 2 2`, one GPU named alike thrice.
    shape = re.compile(r"^\d+ (\d+) \1 \1\n$")
    assert (bool(shape.match(result.stdout)), result.stderr, result.returncode) == (
        bool(shape.match(golden.stdout)), golden.stderr, golden.exit_code,
    )  # fmt: skip


# -- sbatch --wait, the default output, --parsable with clusters ---------------------------


@compares(("10_sbatch_normal.txt", "sbatch --gres=gpu:1 --wrap 'sleep 2'"),
          ("10_sbatch_normal.txt", "cat slurm-1.out; ls slurm-1.out"))  # fmt: skip
def test_sbatch_wait_exits_as_the_job_did_and_the_output_is_slurms_default(platform, here):
    failing = platform.as_job_user("sbatch --wait --wrap 'exit 3'", cwd=here, timeout=120)
    assert failing.returncode == 3, failing.stderr
    job_id = int(failing.stdout.removeprefix("Submitted batch job "))
    assert failing.stdout == f"Submitted batch job {job_id}\n"
    assert ok(platform, "sbatch --wait --parsable --wrap true", here, timeout=120).strip().isdigit()
    # Golden 10: the job's output is slurm-N.out in the submit directory.
    golden = capture("10_sbatch_normal.txt", "sbatch --gres=gpu:1 --wrap 'sleep 2'")
    submitted = platform.as_job_user(golden.command, cwd=here)
    job_id = int(submitted.stdout.removeprefix("Submitted batch job "))
    assert (submitted.stdout.replace(str(job_id), "1"), submitted.stderr) == (golden.stdout, "")
    assert finished(platform, job_id, here) == "COMPLETED"
    golden = capture("10_sbatch_normal.txt", "cat slurm-1.out; ls slurm-1.out")
    listed = platform.as_job_user(f"cat slurm-{job_id}.out; ls slurm-{job_id}.out", cwd=here)
    assert (listed.stdout.replace(str(job_id), "1"), listed.stderr, listed.returncode) == (
        golden.stdout, golden.stderr, golden.exit_code,
    )  # fmt: skip


def test_parsable_names_the_cluster_asked_for_and_no_other_cluster_is_ours(platform, here):
    cluster = api(platform, "GET", "/api/v1/config").json()["config"]["ClusterName"]
    out = ok(platform, f"sbatch --parsable -M {cluster} --wrap 'sleep 30'", here)
    job_id, _, named = out.strip().partition(";")
    assert (job_id.isdigit(), named) == (True, cluster)
    queue = ok(platform, f"squeue -M {cluster} -o %i -j {job_id}", here)
    assert queue == f"CLUSTER: {cluster}\nJOBID\n{job_id}\n"
    assert ok(platform, f"scancel --clusters={cluster} {job_id}", here) == ""
    refused = platform.as_job_user("sbatch --parsable -M elsewhere --wrap true", cwd=here)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr.splitlines() == [
        "sbatch: error: No cluster 'elsewhere' known by database.",
        "sbatch: error: 'elsewhere' can't be reached now, or it is an invalid entry for "
        "--cluster.  Use 'sacctmgr list clusters' to see available clusters.",
    ]
    assert finished(platform, int(job_id), here).startswith("CANCELLED")


# -- scontrol hold / release ------------------------------------------------------------------


def test_a_held_job_waits_until_released_and_a_pending_one_can_be_held(platform, here):
    job_id = int(ok(platform, "sbatch --parsable -H -o held.out --wrap 'echo released'", here))
    reason = f"squeue --noheader -o %T,%r -j {job_id}"
    assert ok(platform, reason, here) == "PENDING,JobHeldUser\n"
    time.sleep(2)  # it stays held: nothing but release lets it run
    assert ok(platform, reason, here) == "PENDING,JobHeldUser\n"
    assert ok(platform, f"scontrol release {job_id}", here) == ""
    assert finished(platform, job_id, here) == "COMPLETED"
    assert (here / "held.out").read_text() == "released\n"

    later = int(ok(platform, "sbatch --parsable --begin=now+1hour --wrap true", here))
    reason = f"squeue --noheader -o %T,%r -j {later}"
    assert ok(platform, reason, here) == "PENDING,BeginTime\n"
    assert ok(platform, f"scontrol hold {later}", here) == ""
    assert ok(platform, reason, here) == "PENDING,JobHeldUser\n"
    assert ok(platform, f"scontrol release {later}", here) == ""
    assert ok(platform, reason, here) == "PENDING,BeginTime\n"
    ok(platform, f"scancel {later}", here)


# -- salloc ... srun ---------------------------------------------------------------------------


def test_salloc_runs_srun_itself_and_the_fallback_shows_the_gpu(platform, here):
    # Exactly as a person types it: salloc's command is srun; the nodes have no nvidia-smi,
    # so the step fails, salloc gives the allocation back and exits as srun did, and the
    # shell's `|| env` runs (outside the allocation).
    line = "salloc -N1 --gres=gpu:1 srun nvidia-smi || env"
    result = platform.as_job_user(line, cwd=here, input="", timeout=180)
    assert result.returncode == 0, result.stderr
    granted = re.search(r"salloc: Granted job allocation (\d+)", result.stderr)
    assert granted, result.stderr
    job_id = int(granted.group(1))
    assert f"salloc: Relinquishing job allocation {job_id}" in result.stderr
    assert re.search(r"srun: error: sim0\d: task 0: Exited with exit code \d+", result.stderr)
    assert "SPUR_API_URL=" in result.stdout and "SLURM_JOB_ID" not in result.stdout
    assert finished(platform, job_id, here) == "FAILED"
    # The fallback inside the step, where the job's GPU variables are: one GPU.
    inside = "salloc -N1 --gres=gpu:1 srun sh -c 'nvidia-smi 2>/dev/null || env'"
    result = platform.as_job_user(inside, cwd=here, input="", timeout=180)
    assert result.returncode == 0, result.stderr
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    assert env["SLURM_STEP_GPUS"] == env["SLURM_JOB_GPUS"] and env["SLURM_GPUS_ON_NODE"] == "1"
    assert env["SLURM_STEP_ID"] == "0" and env["SLURM_JOB_NUM_NODES"] == "1"


# -- what make up gives that account ------------------------------------------------------


def test_the_job_user_runs_demo_envs_commands_but_cannot_read_demo_env(platform, here):
    """demo.env's PATH starts with commands every account can run, and demo.env itself
    (the demo admin's token) is its owner's alone, though the state directory lets
    others pass."""
    assert Path(platform.tools).parent.parent == platform.workspace.parent
    assert ok(platform, "command -v sbatch", here).strip() == f"{platform.tools}/sbatch"
    assert ok(platform, "sbatch --version", here).startswith("slurm ")
    if os.geteuid() == 0:  # another account only where the platform runs as root
        read = platform.as_job_user(f"cat {platform.state_dir / 'demo.env'}", cwd=here)
        assert read.returncode != 0 and "Permission denied" in read.stderr
        assert platform.token not in read.stdout
