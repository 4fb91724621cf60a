"""`scontrol show step` against a loopback web API, as Slurm 22.05 prints it (captured
from the Slurm peer: `sbatch --wrap 'srun -n2 sleep 30 & ...'`, then `show step`).

Differences left: Spur does not record the host and pid of the srun that made a step
(`SrunHost:Pid=(null):0`, Slurm's `vm:14945`), and a step's TRES lists its CPUs and
nodes only (Slurm's adds `mem=8G` and `gres/gpu=1` where they were asked for, and a
`TresPerNode=` line)."""

from __future__ import annotations

import pytest

from scheduler.cli import scontrol
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.scene import NOW, iso, job

RUNNING_STEP = {
    "step_id": 0,
    "name": "sleep",
    "nodes": ["gpu01"],
    "ntasks": 2,
    "cpus": 2,
    "state": "RUNNING",
    "start_time": NOW.timestamp(),
    "end_time": None,
    "exit_code": None,
    "signal": None,
}
ENDED_STEP = {**RUNNING_STEP, "step_id": 1, "state": "COMPLETED", "end_time": NOW.timestamp()}
BATCH = """StepId=26.batch UserId=0 StartTime=2026-11-30T04:05:45 TimeLimit=UNLIMITED
   State=RUNNING Partition=gpu NodeList=gpu01
   Nodes=1 CPUs=0 Tasks=1 Name=batch Network=(null)
   TRES=(null)
   ResvPorts=(null)
   CPUFreqReq=Default
   SrunHost:Pid=(null):0

"""
STEP0 = """StepId=26.0 UserId=0 StartTime=2026-11-30T04:05:45 TimeLimit=UNLIMITED
   State=RUNNING Partition=gpu NodeList=gpu01
   Nodes=1 CPUs=2 Tasks=2 Name=sleep Network=(null)
   TRES=cpu=2,node=1
   ResvPorts=(null)
   CPUFreqReq=Default Dist=Cyclic
   SrunHost:Pid=(null):0

"""


@pytest.fixture
def steps(fake_api: FakeApi, utc: None) -> FakeApi:
    fake_api.queue = [
        job(26, "w", "RUNNING", nodes=["gpu01"], start=NOW, steps=[RUNNING_STEP, ENDED_STEP]),
        job(27, "p", "PENDING"),
    ]
    fake_api.queue[0]["start_time"] = iso(NOW)
    return fake_api


def show(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = scontrol.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_show_step_lists_the_running_steps_with_the_batch_step_first(
    steps: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert show(["show", "step"], capsys) == (0, BATCH + STEP0, "")
    assert show(["show", "step", "26"], capsys) == (0, BATCH + STEP0, "")
    assert show(["show", "step", "26.0"], capsys) == (0, STEP0, "")
    assert show(["show", "step", "26.batch"], capsys) == (0, BATCH, "")
    rc, out, _ = show(["-o", "show", "step", "26.0"], capsys)
    assert (rc, out) == (0, " ".join(STEP0.strip().split("\n   ")) + "\n")
    # Only what the steps print travels, and only running jobs.
    assert steps.requests[-1][2]["state"] == ["RUNNING"]
    assert "steps" in steps.requests[-1][2]["fields"][0].split(",")


def test_what_is_not_there_gets_slurms_words(
    steps: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert show(["show", "step", "26.1"], capsys) == (1, "Job step 26.1 not found\n", "")  # ended
    assert show(["show", "step", "27"], capsys) == (1, "Job step 27. not found\n", "")
    rc, _, err = show(["show", "step", "999.0"], capsys)
    assert (rc, err) == (1, "slurm_get_job_steps error: Invalid job id specified\n")
    steps.queue = []
    assert show(["show", "step"], capsys) == (0, "No job steps in the system\n", "")
