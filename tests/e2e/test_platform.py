"""A GPU job from `sbatch` to `sacct`, through every real process: web, controller,
Celery worker, two agents. Loopback only, random free ports, PostgreSQL and Redis.

Jobs run sandboxed in the demo organisation's workspace: each test submits from a
directory of its own there (`here`), where its jobs run and write."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from agents.client import AgentClient
from scheduler.client import ControllerClient
from scheduler.rpc.errors import NotFound
from tests.fixtures.platform import (
    Platform,
    api,
    job_processes,
    processes_gone,
    start_platform,
)
from tests.fixtures.processes import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Platform:
    yield from start_platform(tmp_path_factory.mktemp("platform"))


@pytest.fixture
def here(platform: Platform, request: pytest.FixtureRequest) -> Path:
    return platform.workspace_dir(re.sub(r"\W", "_", request.node.name))


def submit(platform: Platform, *args: str, cwd: Path) -> int:
    result = platform.cli("sbatch", "--parsable", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def sacct_state(platform: Platform, job_id: int) -> tuple[str, str]:
    result = platform.cli(
        "sacct", "-X", "-P", "-n", "-j", str(job_id), "--format=JobID,State,ExitCode"
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"{job_id}|")]
    if not lines:
        return ("", "")
    _, state, exit_code = lines[0].split("|")
    return state, exit_code


def wait_for_state(platform: Platform, job_id: int, wanted: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state, exit_code = sacct_state(platform, job_id)
        if state.split()[0:1] == [wanted]:
            return exit_code
        time.sleep(0.2)
    raise AssertionError(
        f"job {job_id} is {state!r}, not {wanted}\n{platform.log('worker')[-3000:]}"
    )


def test_a_two_gpu_job_completes_with_its_own_two_gpus(platform, here):
    job_id = submit(
        platform,
        "--gres=gpu:2",
        "-J",
        "twogpu",
        "-o",
        "out-%j.txt",
        "--wrap",
        "env | grep -E '^(CUDA|ROCR)_VISIBLE_DEVICES|^SLURM_JOB_ID'",
        cwd=here,
    )
    assert wait_for_state(platform, job_id, "COMPLETED") == "0:0"
    output = (here / f"out-{job_id}.txt").read_text()
    env = dict(line.split("=", 1) for line in output.splitlines())
    assert env["SLURM_JOB_ID"] == str(job_id)
    visible = env.get("CUDA_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES")
    devices = visible.split(",")
    assert len(devices) == 2 and len(set(devices)) == 2, output

    parsable = platform.cli("sacct", "-P", "-j", str(job_id))
    lines = parsable.stdout.splitlines()
    assert lines[0] == "JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode"
    assert lines[1].split("|")[0] == str(job_id)
    assert lines[1].split("|")[1] == "twogpu"
    assert lines[1].split("|")[-2:] == ["COMPLETED", "0:0"]


def test_cancelling_a_running_job_kills_its_process(platform, here):
    job_id = submit(platform, "--gres=gpu:1", "--wrap", "exec sleep 3011", cwd=here)
    wait_until(lambda: bool(job_processes("sleep 3011")), what="the job's process")

    queue = platform.cli("squeue", "-j", str(job_id), "-h", "-o", "%i %T")
    assert queue.stdout.split() == [str(job_id), "RUNNING"]

    result = platform.cli("scancel", str(job_id))
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    wait_for_state(platform, job_id, "CANCELLED")
    assert processes_gone("sleep 3011"), "the job's process is still alive after scancel"


def test_more_gpu_jobs_than_fit_queue_and_then_all_run(platform, here):
    # 2 nodes × 8 GPUs: five 8-GPU jobs cannot all run at once.
    ids = [submit(platform, "--gres=gpu:8", "--wrap", "sleep 2", cwd=here) for _ in range(5)]
    deadline = time.monotonic() + 15
    seen_waiting = False
    while time.monotonic() < deadline and not seen_waiting:
        queue = platform.cli("squeue", "-h", "-o", "%i %t %R")
        rows = [line.split() for line in queue.stdout.splitlines()]
        seen_waiting = any(r[1] == "PD" and r[2] == "(Resources)" for r in rows if int(r[0]) in ids)
        time.sleep(0.1)
    assert seen_waiting, "no job waited for resources"
    for job_id in ids:
        assert wait_for_state(platform, job_id, "COMPLETED", timeout=90) == "0:0"


def test_a_request_larger_than_any_node_is_refused_at_submit(platform, tmp_path):
    result = platform.cli("sbatch", "--gres=gpu:9", "--wrap", "true", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(
        "sbatch: error: Batch job submission failed: Requested node configuration is not available"
    )


def test_an_unknown_gpu_type_is_refused_by_name(platform, tmp_path):
    result = platform.cli("sbatch", "--gres=gpu:h200:1", "--wrap", "true", cwd=tmp_path)
    assert result.returncode == 1
    assert "unknown GPU type 'h200'" in result.stderr


def test_a_script_without_a_shebang_exits_1_with_slurms_message(platform, tmp_path):
    script = tmp_path / "noshebang.sh"
    script.write_text("echo hi\n")
    result = platform.cli("sbatch", str(script), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == (
        "sbatch: error: This does not look like a batch script.  The first"
    )


def test_a_forged_token_is_refused(platform, tmp_path):
    result = platform.cli("squeue", env={"SPUR_TOKEN": "spur_forged"})
    assert result.returncode != 0
    assert api(platform, "GET", "/api/v1/queue").status_code == 200
    forged = platform.env | {"SPUR_TOKEN": "spur_forged"}
    import httpx

    answer = httpx.get(
        platform.web_url + "/api/v1/jobs",
        headers={"Authorization": f"Bearer {forged['SPUR_TOKEN']}"},
    )
    assert answer.status_code == 401


def test_sinfo_shows_both_simulated_nodes(platform):
    result = platform.cli("sinfo", "-N", "-h", "-o", "%N %G")
    rows = sorted(result.stdout.split("\n")[:-1])
    assert [r.split()[0] for r in rows] == ["sim01", "sim02"]
    assert "mi300x:8" in rows[0] and "h100:8" in rows[1]


def test_a_throttled_array_and_a_job_that_depends_on_it_run_in_order(platform, here):
    array_id = submit(
        platform,
        "--array=0-3%2",
        "--gres=gpu:1",
        "--wrap",
        "echo $SLURM_ARRAY_JOB_ID:$SLURM_ARRAY_TASK_ID; sleep 2",
        cwd=here,
    )
    after = submit(
        platform,
        f"--dependency=afterok:{array_id}",
        "--wrap",
        "ls slurm-*_*.out > after.txt",
        cwd=here,
    )
    # While two tasks run, the rest wait on the throttle, shown as Slurm shows them.
    deadline = time.monotonic() + 20
    seen_throttle = seen_dependency = False
    while time.monotonic() < deadline and not (seen_throttle and seen_dependency):
        rows = platform.cli("squeue", "-h", "-o", "%i %t %r").stdout.splitlines()
        seen_throttle |= f"{array_id}_[2-3%2] PD JobArrayTaskLimit" in rows
        seen_dependency |= f"{after} PD Dependency" in rows
        time.sleep(0.1)
    assert seen_throttle and seen_dependency
    assert wait_for_state(platform, after, "COMPLETED", timeout=60) == "0:0"
    listed = (here / "after.txt").read_text().split()
    assert listed == [f"slurm-{array_id}_{i}.out" for i in range(4)]
    for i in range(4):
        out = (here / f"slurm-{array_id}_{i}.out").read_text().strip()
        assert out == f"{array_id}:{i}"
    # The history names the tasks as Slurm does, and -j with the array id finds them all.
    deadline = time.monotonic() + 20
    rows: list[str] = []
    while time.monotonic() < deadline and len(rows) < 4:
        history = platform.cli("sacct", "-X", "-n", "-P", "-j", str(array_id), "-o", "JobID,State")
        rows = history.stdout.splitlines()
        time.sleep(0.2)
    assert rows == [f"{array_id}_{i}|COMPLETED" for i in range(4)]


def test_a_spot_job_is_preempted_and_requeued_for_a_normal_job(platform, here):
    spot = [
        submit(
            platform,
            "-q",
            "spot",
            "--gres=gpu:8",
            "--wrap",
            "echo start >> spot-$SLURM_JOB_ID.log; exec sleep 300",
            cwd=here,
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 30
    while not all((here / f"spot-{j}.log").exists() for j in spot):
        assert time.monotonic() < deadline, "the spot jobs never started"
        time.sleep(0.1)
    urgent = submit(platform, "--gres=gpu:8", "--wrap", "true", cwd=here)
    assert wait_for_state(platform, urgent, "COMPLETED", timeout=60) == "0:0"
    # One spot job made room: it was stopped and queued again, then ran again.
    restarted = [j for j in spot if (here / f"spot-{j}.log").read_text().count("start") == 2]
    deadline = time.monotonic() + 30
    while not restarted and time.monotonic() < deadline:
        time.sleep(0.2)
        restarted = [j for j in spot if (here / f"spot-{j}.log").read_text().count("start") == 2]
    assert len(restarted) == 1
    platform.cli("scancel", *map(str, spot))


def test_a_no_requeue_spot_job_is_preempted_for_good_and_says_so(platform, here):
    # Both nodes full of spot work that may not be requeued: a normal job preempts one of
    # them, which ends PREEMPTED (not requeued), in sacct, the API and the live queue.
    spot = [
        submit(platform, "-q", "spot", "--no-requeue", "--gres=gpu:8", "--wrap",
               "echo $$ > spot-$SLURM_JOB_ID.pid; exec sleep 300", cwd=here)
        for _ in range(2)
    ]  # fmt: skip
    wait_until(lambda: all((here / f"spot-{j}.pid").exists() for j in spot), what="spot jobs")
    urgent = submit(platform, "--gres=gpu:8", "--wrap", "true", cwd=here)
    assert wait_for_state(platform, urgent, "COMPLETED", timeout=60) == "0:0"

    def preempted() -> list[int]:
        return [j for j in spot if sacct_state(platform, j)[0] == "PREEMPTED"]

    wait_until(lambda: bool(preempted()), what="a PREEMPTED spot job")
    (victim,) = preempted()
    assert sacct_state(platform, victim) == ("PREEMPTED", "0:15")
    job = api(platform, "GET", f"/api/v1/jobs/{victim}").json()
    assert (job["state"], job["attempt"]) == ("PREEMPTED", 1)  # never started again
    queue = platform.cli("squeue", "-h", "-t", "PR", "-o", "%i %t")
    assert queue.stdout.split() == [str(victim), "PR"]
    platform.cli("scancel", *map(str, spot))


def test_gpus_spread_over_nodes_count_the_same_everywhere(platform, tmp_path):
    # --gpus=3 over 2 nodes holds 2 on each: 4 in the core, the API, squeue and the portal.
    job_id = submit(platform, "--gpus=3", "-N2", "--wrap", "sleep 30", cwd=tmp_path)
    deadline = time.monotonic() + 30
    while True:
        live = api(platform, "GET", "/api/v1/queue", params={"id": job_id}).json()["results"]
        if live and live[0]["state"] == "RUNNING":
            break
        assert time.monotonic() < deadline, live
        time.sleep(0.1)
    held = sum(len(a["gpus"]) for a in live[0]["allocation"].values())
    assert (live[0]["num_gpus"], held, live[0]["gpu_milli"]) == (4, 4, 4000)
    assert api(platform, "GET", f"/api/v1/jobs/{job_id}").json()["num_gpus"] == 4
    squeue = platform.cli("squeue", "-h", "-j", str(job_id), "-O", "NumNodes,tres-per-node")
    assert squeue.stdout.split() == ["2", "gres:gpu:2"]
    # The history (sacct's) is mirrored from the controller's events a moment later.
    deadline = time.monotonic() + 10
    while True:
        sacct = platform.cli("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "AllocTRES")
        if "gres/gpu=" in sacct.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert "gres/gpu=4" in sacct.stdout
    with signed_in(platform) as browser:
        page = browser.get("/").text
    row = page[page.index(f'data-job-id="{job_id}"') :].split("</tr>")[0]
    assert '<td data-field="num_gpus">4</td>' in row
    platform.cli("scancel", str(job_id))


@contextmanager
def signed_in(platform: Platform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=platform.web_url, follow_redirects=True) as browser:
        form = browser.get("/accounts/login/").text
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
        signed = browser.post(
            "/accounts/login/",
            data={
                "csrfmiddlewaretoken": csrf,
                "login": "admin@example.com",
                "password": "e2e-admin-password",
            },
            headers={"Referer": f"{platform.web_url}/accounts/login/"},
        )
        assert signed.status_code == 200
        yield browser


def test_a_person_signs_in_to_the_portal_over_plain_http_and_sees_the_jobs(platform):
    with signed_in(platform) as browser:
        assert browser.cookies.get("sessionid")
        page = browser.get("/").text
        assert "Active jobs of" in page and "Sign out" in page


# -- contained jobs ----------------------------------------------------------------------


def test_a_job_runs_as_its_organisations_account_and_sees_none_of_the_platform(platform, here):
    state = platform.state_dir
    secrets = [state / name for name in ("cluster-token", "secret-key", "spur.toml", "demo.env")]
    reads = "; ".join(f"cat {path}" for path in secrets)
    script = f"id -u; id -un; {reads}; ls {state / 'agents'}; true"
    job_id = submit(platform, "-o", "who.txt", "--wrap", script, cwd=here)
    assert wait_for_state(platform, job_id, "COMPLETED") == "0:0"
    out = (here / "who.txt").read_text()
    uid, name = out.splitlines()[:2]
    assert int(uid) != 0
    # demo.env names that account, so that tools can be run as the jobs' user.
    assert name == platform.job_user
    if os.geteuid() == 0:
        assert int(uid) == here.stat().st_uid and name == "spur-demo"
    assert platform.cluster_token not in out
    assert out.count("No such file or directory") == len(secrets) + 1


def test_an_output_file_outside_the_workspace_is_never_written(platform, here):
    target = Path(f"/etc/spur-e2e-{os.getpid()}")
    result = platform.cli("sbatch", "--parsable", "-o", str(target), "--wrap", "echo x", cwd=here)
    # Refused at submit, on the path's text: nothing is queued.
    assert result.returncode == 1
    assert f"output file {target} is outside your organisation's workspace" in result.stderr
    assert not target.exists()


def test_a_job_over_its_memory_ends_out_of_memory(platform, here):
    hog = "python3 -c 'b = bytearray(1 << 30)'"
    job_id = submit(platform, "--mem=64M", "--wrap", hog, cwd=here)
    wait_for_state(platform, job_id, "OUT_OF_MEMORY")


def test_the_agent_that_ran_a_job_serves_its_output(platform, here):
    job_id = submit(platform, "--wrap", "echo from the sandbox", cwd=here)
    assert wait_for_state(platform, job_id, "COMPLETED") == "0:0"
    [node] = api(platform, "GET", f"/api/v1/jobs/{job_id}").json()["nodes"]
    with ControllerClient([platform.ctld_url], platform.cluster_token) as controller:
        urls = {n["name"]: n["agent_url"] for n in controller.nodes()}
    with AgentClient(urls[node], platform.cluster_token) as agent:
        piece = agent.output(job_id)
    assert (piece["data"], piece["running"], piece["attempt"]) == ("from the sandbox\n", False, 1)
    [other] = [url for name, url in urls.items() if name != node]
    with AgentClient(other, platform.cluster_token) as agent, pytest.raises(NotFound):
        agent.output(job_id)


def test_a_suspended_job_stops_runs_on_when_resumed_and_can_be_cancelled(platform, here):
    # The web's operator check is tested in tests/spurcloud; here the controller is asked
    # as the web asks for an operator, and the rest is real: Raft, Celery, the agent.
    from scheduler.core.contract import JobAction

    script = "i=0; while true; do i=$((i+1)); echo $i >> counter.txt; sleep 0.1; done"
    job_id = submit(platform, "--wrap", script, cwd=here)
    counter = here / "counter.txt"

    def lines() -> int:
        return len(counter.read_text().splitlines()) if counter.exists() else 0

    def grows() -> bool:
        before = lines()
        time.sleep(0.5)
        return lines() > before

    wait_until(lambda: lines() > 2, timeout=60, what="the job's counter")
    with ControllerClient([platform.ctld_url], platform.cluster_token) as controller:
        job = controller.act(job_id, JobAction.SUSPEND, tenant=None, admin=True)
        assert job["state"] == "SUSPENDED"
        wait_until(lambda: not grows(), timeout=20, what="the job to stop")
        queue = platform.cli("squeue", "-j", str(job_id), "-h", "-o", "%i %t %T")
        assert queue.stdout.split() == [str(job_id), "S", "SUSPENDED"]
        wait_for_state(platform, job_id, "SUSPENDED")
        # A tenant is no administrator: Slurm's words, exit 1.
        refused = platform.cli("scontrol", "resume", str(job_id))
        assert (refused.returncode, refused.stderr) == (
            1,
            f"Access/permission denied for job {job_id}\n",
        )
        controller.act(job_id, JobAction.RESUME, tenant=None, admin=True)
        wait_until(grows, timeout=20, what="the job to run on")
        controller.act(job_id, JobAction.SUSPEND, tenant=None, admin=True)
        wait_until(lambda: not grows(), timeout=20, what="the job to stop again")
    result = platform.cli("scancel", str(job_id))
    assert result.returncode == 0
    wait_for_state(platform, job_id, "CANCELLED")
    assert not grows()
