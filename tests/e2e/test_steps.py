"""Job steps end to end (srun inside batch jobs), through every real process: web,
controller, Celery worker, two agents, jobs sandboxed as the organisation's account.

Both nodes play H100 nodes, so a two-node job can hold GPUs on each."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.platform import Platform, start_platform
from tests.fixtures.processes import BIN

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Platform:
    yield from start_platform(tmp_path_factory.mktemp("steps"), nodes="sim01=h100-8,sim02=h100-8")


@pytest.fixture
def here(platform: Platform, request: pytest.FixtureRequest) -> Path:
    return platform.workspace_dir(re.sub(r"\W", "_", request.node.name))


def submit(platform: Platform, *args: str, cwd: Path) -> int:
    result = platform.cli("sbatch", "--parsable", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def script(path: Path, text: str) -> str:
    path.write_text("#!/bin/bash\n" + text)
    return str(path)


def sacct_rows(platform: Platform, job_id: int) -> list[list[str]]:
    result = platform.cli(
        "sacct", "-P", "-n", "-j", str(job_id), "--format=JobID,JobName,State,ExitCode"
    )
    assert result.returncode == 0, result.stderr
    return [line.split("|") for line in result.stdout.splitlines()]


def wait_ended(platform: Platform, job_id: int, timeout: float = 90) -> list[str]:
    deadline = time.monotonic() + timeout
    rows: list[list[str]] = []
    while time.monotonic() < deadline:
        rows = sacct_rows(platform, job_id)
        if rows and rows[0][2].split()[0] not in ("PENDING", "RUNNING", "COMPLETING"):
            return rows[0]
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not end: {rows}\n{platform.log('agent-sim01')[-3000:]}")


def test_srun_on_one_node_runs_one_task_per_rank_with_labels_and_exit_code(platform, here):
    job = script(
        here / "one.sh",
        "srun -l -n3 bash -c 'echo $SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID "
        "$SLURM_STEP_ID $SLURM_STEPID $SLURM_STEP_NUM_TASKS $SLURM_STEP_NODELIST'\n"
        "echo rc=$?\n"
        "srun -n2 bash -c 'exit $((SLURM_PROCID + 3))'\n"
        "echo rc=$?\n",
    )
    job_id = submit(platform, "-n3", "-o", "one-%j.out", job, cwd=here)
    state = wait_ended(platform, job_id)
    output = (here / f"one-{job_id}.out").read_text()
    assert state[2:] == ["COMPLETED", "0:0"], output
    lines = output.splitlines()
    labelled = sorted(line for line in lines if re.match(r"^\d: ", line))
    assert labelled == [
        "0: 0 0 0 0 0 3 sim01",
        "1: 1 1 0 0 0 3 sim01",
        "2: 2 2 0 0 0 3 sim01",
    ], output
    assert "rc=0" in lines
    # The step's exit code is its tasks' highest; srun says which task failed how.
    assert "rc=4" in lines, output
    assert "srun: error: sim01: task 1: Exited with exit code 4" in output


def test_srun_on_two_nodes_fans_out_with_each_nodes_gpus(platform, here):
    job = script(
        here / "two.sh",
        "srun -l bash -c \"env | grep -E '^(SLURM_(PROCID|NODEID|STEP_NODELIST|STEP_GPUS|"
        "STEP_NUM_TASKS|JOB_ID|STEP_ID)|SLURMD_NODENAME|CUDA_VISIBLE_DEVICES)=' | sort\" "
        "| sort -s -n -k1,1\n",
    )
    job_id = submit(platform, "-N2", "--gres=gpu:2", "-o", "two-%j.out", job, cwd=here)
    state = wait_ended(platform, job_id)
    output = (here / f"two-{job_id}.out").read_text()
    assert state[2:] == ["COMPLETED", "0:0"], output
    tasks: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        label, _, pair = line.partition(": ")
        key, _, value = pair.partition("=")
        tasks.setdefault(label, {})[key] = value
    assert sorted(tasks) == ["0", "1"], output
    for rank, node in (("0", "sim01"), ("1", "sim02")):
        env = tasks[rank]
        assert env["SLURM_PROCID"] == rank
        assert env["SLURM_NODEID"] == rank
        assert env["SLURMD_NODENAME"] == node
        assert env["SLURM_JOB_ID"] == str(job_id)
        assert env["SLURM_STEP_ID"] == "0"
        assert env["SLURM_STEP_NODELIST"] == "sim[01-02]"
        assert env["SLURM_STEP_NUM_TASKS"] == "2"
        assert len(env["SLURM_STEP_GPUS"].split(",")) == 2
        assert env["CUDA_VISIBLE_DEVICES"] == env["SLURM_STEP_GPUS"]

    rows = sacct_rows(platform, job_id)
    ids = [r[0] for r in rows]
    assert ids[:1] == [str(job_id)] and f"{job_id}.batch" in ids and f"{job_id}.0" in ids, rows
    step = next(r for r in rows if r[0] == f"{job_id}.0")
    assert step[1:] == ["bash", "COMPLETED", "0:0"]
    allocations = platform.cli("sacct", "-X", "-P", "-n", "-j", str(job_id), "--format=JobID")
    assert allocations.stdout.split() == [str(job_id)]


def test_srun_needs_only_slurm_job_id_of_the_job_environment(platform, here):
    job = script(
        here / "bare.sh",
        "unset $(env | grep -o '^SLURM_[A-Z_]*' | grep -vx SLURM_JOB_ID)\n"
        "env | grep -c '^SLURM_' \n"
        "srun -N2 -l hostname >/dev/null && echo stepped\n",
    )
    job_id = submit(platform, "-N2", "-o", "bare-%j.out", job, cwd=here)
    wait_ended(platform, job_id)
    assert (here / f"bare-{job_id}.out").read_text().split() == ["1", "stepped"]


def test_srun_gpus_per_task_export_output_patterns_and_stdin(platform, here):
    job = script(
        here / "opts.sh",
        "echo hello | srun -n2 -l cat\n"
        "srun -n2 --gpus-per-task=1 -l bash -c 'echo $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS'\n"
        "export FOO=bar\n"
        "srun -n1 --export=NONE bash -c 'echo none foo=${FOO:-unset} job=$SLURM_JOB_ID'\n"
        "srun -n1 --export=FOO,BAZ=qux bash -c 'echo list foo=$FOO baz=$BAZ'\n"
        "srun -n2 -o 'task-%j-%t.txt' -u --mpi=none --cpu-bind=cores "
        "bash -c 'echo rank $SLURM_PROCID'\n",
    )
    job_id = submit(platform, "-n2", "--gres=gpu:2", "-o", "opts-%j.out", job, cwd=here)
    state = wait_ended(platform, job_id)
    output = (here / f"opts-{job_id}.out").read_text()
    assert state[2:] == ["COMPLETED", "0:0"], output
    lines = output.splitlines()
    # srun's stdin goes to every task, Slurm's default (--input=all, as the peer shows).
    assert "0: hello" in lines and "1: hello" in lines
    # Each task sees its own GPU, one of the job's two.
    gpus = {line[:1]: line[3:].split() for line in lines if re.match(r"^[01]: \d", line)}
    assert gpus["0"][0] == gpus["0"][1] and gpus["1"][0] == gpus["1"][1], output
    assert gpus["0"] != gpus["1"]
    assert f"none foo=unset job={job_id}" in lines
    assert "list foo=bar baz=qux" in lines
    for rank in (0, 1):
        assert (here / f"task-{job_id}-{rank}.txt").read_text() == f"rank {rank}\n"


def wait_for(platform: Platform, job_id: int, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = sacct_rows(platform, job_id)
        if rows and rows[0][2].split()[0] == state:
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never {state}: {sacct_rows(platform, job_id)}")


def test_salloc_holds_an_allocation_for_its_command_and_ends_with_its_exit_code(platform, here):
    result = platform.cli(
        "salloc",
        "-N2",
        "--gres=gpu:1",
        "sh",
        "-c",
        "echo job=$SLURM_JOB_ID nodes=$SLURM_NODELIST n=$SLURM_NNODES; "
        "srun -l bash -c 'echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_STEP_GPUS'; "
        "srun nvidia-smi-is-not-here || echo fallback; exit 3",
        cwd=here,
        timeout=120,
        input="",
        # srun on the PATH of salloc's command, as on a login node.
        env={"PATH": f"{BIN}:{os.environ['PATH']}"},
    )
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    job_id = int(lines[0].split()[0].removeprefix("job="))
    assert lines[0] == f"job={job_id} nodes=sim[01-02] n=2"
    labelled = sorted(line for line in lines if re.match(r"^\d: ", line))
    assert [line.split()[:3] for line in labelled] == [["0:", "0", "sim01"], ["1:", "1", "sim02"]]
    assert "fallback" in lines
    assert f"salloc: Granted job allocation {job_id}" in result.stderr
    assert f"salloc: Relinquishing job allocation {job_id}" in result.stderr
    wait_for(platform, job_id, "FAILED")
    rows = {r[0]: r for r in sacct_rows(platform, job_id)}
    assert rows[f"{job_id}.0"][2:] == ["COMPLETED", "0:0"]
    assert rows[f"{job_id}.1"][2:] == ["FAILED", "127:0"]


def test_srun_outside_an_allocation_allocates_runs_one_step_and_gives_it_back(platform, here):
    result = platform.cli(
        "srun", "-N2", "--gres=gpu:1", "-l", "hostname", cwd=here, timeout=120, input=""
    )
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[0] for line in sorted(result.stdout.splitlines())] == ["0", "1"]
    failing = platform.cli("srun", "sh", "-c", "exit 7", cwd=here, timeout=120, input="")
    assert failing.returncode == 7
    assert "srun: error: sim01: task 0: Exited with exit code 7" in failing.stderr


def test_srun_outside_an_allocation_with_impossible_resources_creates_nothing(platform, here):
    before = platform.cli("sacct", "-X", "-P", "-n", "--format=JobID").stdout
    result = platform.cli("srun", "--gres=gpu:9", "true", cwd=here, input="")
    assert result.returncode == 1
    assert result.stderr == (
        "srun: error: Unable to allocate resources: Requested node configuration is not available\n"
    ) or result.stderr.startswith(
        "srun: error: Unable to allocate resources: Requested node configuration is not available"
    )
    assert platform.cli("sacct", "-X", "-P", "-n", "--format=JobID").stdout == before


def test_scancel_of_one_step_cancels_that_step_only(platform, here):
    job = script(
        here / "steps.sh",
        "srun sleep 3301 &\nsleep 1\nsrun -n1 bash -c 'echo second'\nwait\necho waited rc=$?\n",
    )
    job_id = submit(platform, "-o", "steps-%j.out", job, cwd=here)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = {r[0]: r for r in sacct_rows(platform, job_id)}
        if rows.get(f"{job_id}.1", ["", "", ""])[2] == "COMPLETED":
            break
        time.sleep(0.3)
    assert rows[f"{job_id}.0"][2] == "RUNNING", rows
    result = platform.cli("scancel", f"{job_id}.0")
    assert result.returncode == 0, result.stderr
    wait_ended(platform, job_id)
    rows = {r[0]: r for r in sacct_rows(platform, job_id)}
    assert rows[f"{job_id}.0"][2] == "CANCELLED"
    assert rows[f"{job_id}.1"][2:] == ["COMPLETED", "0:0"]
    assert rows[str(job_id)][2] == "COMPLETED"
    output = (here / f"steps-{job_id}.out").read_text()
    assert "second" in output and "waited" in output


# -- the step credential and the signed step launch: try to break them ----------------------


def _credential_of(platform: Platform, here: Path, name: str) -> tuple[int, str, str]:
    job = script(
        here / f"{name}.sh",
        f'echo "$SPUR_STEP_TOKEN $SPUR_STEP_URL" > {name}.cred\nexec sleep 3400\n',
    )
    job_id = submit(platform, job, cwd=here)
    path = here / f"{name}.cred"
    deadline = time.monotonic() + 60
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, "the job never wrote its credential"
        time.sleep(0.2)
    token, url = path.read_text().split()
    return job_id, token, url.split(",")[0]


def _create(url: str, job_id: int, token: str, argv: list[str]) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/jobs/{job_id}/steps",
        json={"argv": argv, "cwd": "/tmp"},
        headers={"Authorization": f"Bearer {token}"} if token else {},
        timeout=30,
    )


def test_a_step_credential_is_its_own_jobs_only_and_dies_with_it(platform, here):
    job_a, token_a, url = _credential_of(platform, here, "credA")
    job_b, token_b, _ = _credential_of(platform, here, "credB")
    assert token_a != token_b
    # Another job's credential, a forged one, none at all: 401, nothing created.
    assert _create(url, job_b, token_a, ["true"]).status_code == 401
    forged = token_a[:-4] + ("0000" if not token_a.endswith("0000") else "1111")
    assert _create(url, job_a, forged, ["true"]).status_code == 401
    renamed = token_a.replace(f".{job_a}.", f".{job_b}.", 1)
    assert _create(url, job_b, renamed, ["true"]).status_code == 401
    assert _create(url, job_a, "", ["true"]).status_code == 401
    # It opens no other controller route: not the cluster token.
    headers = {"Authorization": f"Bearer {token_a}"}
    assert httpx.get(f"{url}/v1/jobs", headers=headers).status_code == 401
    assert httpx.post(f"{url}/v1/jobs", headers=headers, json={}).status_code == 401
    # A bad request is refused at the edge, before the Raft log.
    bad = httpx.post(
        f"{url}/v1/jobs/{job_a}/steps",
        json={"argv": ["x"] * 5000, "cwd": "/tmp"},
        headers=headers,
        timeout=30,
    )
    assert bad.status_code == 400
    too_many = httpx.post(
        f"{url}/v1/jobs/{job_a}/steps",
        json={"argv": ["true"], "nodes": 3},
        headers=headers,
        timeout=30,
    )
    assert too_many.status_code == 400
    assert "Only allocated 1 nodes asked for 3" in too_many.json()["detail"]

    # A signed launch runs once, as signed: altered or replayed, the agent refuses it.
    created = _create(url, job_a, token_a, ["echo", "once"])
    assert created.status_code == 201, created.text
    launch = created.json()["launches"][0]
    agent = f"{launch['agent_url']}/v1/jobs/{job_a}/steps"
    altered = {**launch["payload"], "step": {**launch["payload"]["step"], "argv": ["id"]}}
    assert httpx.post(agent, json=altered, timeout=30).status_code == 400
    unsigned = {k: v for k, v in launch["payload"].items() if k != "signature"}
    assert httpx.post(agent, json=unsigned, timeout=30).status_code == 400
    ran = httpx.post(agent, json=launch["payload"], timeout=30)
    assert ran.status_code == 200 and '"x":0' in ran.text
    assert httpx.post(agent, json=launch["payload"], timeout=30).status_code == 409

    # Once the job has ended, its credential is worth nothing.
    assert platform.cli("scancel", str(job_a), str(job_b)).returncode == 0
    wait_ended(platform, job_a)
    expired = _create(url, job_a, token_a, ["true"])
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]


def test_a_step_outlives_its_nodes_first_lease_as_the_batch_script_does(platform, here):
    # The lease is node_timeout_s / 2 = 15 s: the agent renews it for step tasks too.
    job = script(here / "long.sh", "srun -N2 -l bash -c 'sleep 20; echo survived'\n")
    job_id = submit(platform, "-N2", "-o", "long-%j.out", job, cwd=here)
    state = wait_ended(platform, job_id, timeout=120)
    output = (here / f"long-{job_id}.out").read_text()
    assert state[2:] == ["COMPLETED", "0:0"], output
    assert sorted(output.splitlines()) == ["0: survived", "1: survived"]
