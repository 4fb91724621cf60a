"""sacct's job step rows (`N.0`, `N.1`, after `N.batch`), against Slurm 22.05's
(reference/slurm-golden/60_sacct_default.txt: jobs 26, 28 and 29), built from the job
object's `steps` as the web API's history answers them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from scheduler.slurm.sacct_format import DEFAULT_FIELDS, parse_fields
from scheduler.slurm.sacct_records import format_sacct, records
from tests.scheduler.slurm.golden import capture, differs
from tests.scheduler.slurm.scene import NOW, job

T0 = NOW - timedelta(minutes=30)


def _step(step_id: int, name: str, nodes: list[str], cpus: int, state: str = "COMPLETED",
          code: int = 0, signal: int = 0) -> dict[str, Any]:  # fmt: skip
    start = (T0 + timedelta(seconds=1)).timestamp()
    return {
        "step_id": step_id,
        "name": name,
        "nodes": nodes,
        "ntasks": len(nodes),
        "cpus": cpus,
        "state": state,
        "start_time": start,
        "end_time": start + 1,
        "exit_code": code,
        "signal": signal,
    }


def golden_jobs() -> list[dict[str, Any]]:
    two = ["gpu01", "gpu02"]
    return [
        # sbatch -N2 with `srun -l ...` in its script: batch step, then step 0.
        job(
            26,
            "env2n",
            "COMPLETED",
            nodes=two,
            num_nodes=2,
            num_cpus=2,
            start=T0,
            end=T0 + timedelta(seconds=3),
            exit_code=0,
            signal=0,
            steps=[_step(0, "bash", two, 2)],
        ),  # fmt: skip
        # srun -N2 outside an allocation: no batch step.
        job(
            28,
            "hostname",
            "COMPLETED",
            nodes=two,
            num_nodes=2,
            num_cpus=2,
            start=T0,
            end=T0 + timedelta(seconds=2),
            exit_code=0,
            signal=0,
            interactive=True,
            steps=[_step(0, "hostname", two, 2)],
        ),  # fmt: skip
        job(
            29,
            "bash",
            "COMPLETED",
            nodes=["gpu01"],
            num_cpus=1,
            start=T0,
            end=T0 + timedelta(seconds=2),
            exit_code=0,
            signal=0,
            interactive=True,
            steps=[_step(0, "bash", ["gpu01"], 1)],
        ),  # fmt: skip
    ]


def golden(command: str) -> list[str]:
    out = []
    for line in capture("60_sacct_default.txt", command).stdout.splitlines():
        first = line.split(" ")[0].split(".")[0]
        if first in ("26", "27", "28", "29") and first != "27" or not first[:1].isdigit():
            out.append(line)
    return out


@differs(("60_sacct_default.txt", "sacct"))
def test_step_rows_follow_the_batch_step_as_in_slurm() -> None:
    rows = records(golden_jobs(), now=NOW, allocations_only=False)
    assert format_sacct(rows, parse_fields(DEFAULT_FIELDS)) == golden("sacct")


def test_allocations_only_hides_every_step() -> None:
    rows = records(golden_jobs(), now=NOW, allocations_only=True)
    assert [r.step for r in rows] == [None, None, None]


def test_a_steps_own_state_nodes_and_exit_code() -> None:
    failed = _step(1, "python", ["gpu02"], 1, state="FAILED", code=3)
    cancelled = _step(2, "sleep", ["gpu01", "gpu02"], 2, state="CANCELLED", signal=9)
    [j] = [job(40, "train", "RUNNING", nodes=["gpu01", "gpu02"], num_nodes=2, num_cpus=2,
               start=T0, steps=[failed, cancelled])]  # fmt: skip
    lines = format_sacct(
        records([j], now=NOW, allocations_only=False),
        parse_fields("JobID,JobName,NNodes,NodeList,State,ExitCode,AllocCPUS"),
        parsable="P",
    )
    assert lines[1:] == [
        "40|train|2|gpu[01-02]|RUNNING|0:0|2",
        "40.batch|batch|1|gpu01|RUNNING|0:0|1",
        "40.1|python|1|gpu02|FAILED|3:0|1",
        "40.2|sleep|2|gpu[01-02]|CANCELLED|0:9|2",
    ]
