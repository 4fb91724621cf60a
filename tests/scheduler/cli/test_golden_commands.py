"""The golden captures' command lines, run as given through our commands against a
loopback web API holding the captured cluster's scene (tests/scheduler/cli/
golden_commands.py), compared with what Slurm 22.05 printed: stdout, stderr and exit
code. Submissions are answered by a real scheduler state of the captured cluster.

The scenes are the captures' moments: jobs 10-15 of files 20-33 (scene.scene_jobs), the
array 17 and the chain 18-21 of files 41-42, each as the controller's job objects give
them. Where the capture differs from ours on purpose the test says how (`@differs`;
test_golden_coverage.DIFFERENCES gives the reason).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.scheduler.cli.golden_commands import GoldenRun
from tests.scheduler.slurm.golden import captures, compares, differs
from tests.scheduler.slurm.scene import NOW, job, scene_jobs

# -- submissions: sbatch as the controller answers it -------------------------------------

SAME_SUBMISSIONS = [
    (name, item.command)
    for name in (
        "10_sbatch_normal.txt",
        "11_sbatch_parsable.txt",
        "12_sbatch_invalid_option.txt",
        "20_scene1_submissions.txt",
        "40_timeout_job.txt",
        "41_job_array.txt",
        "42_dependency_chain.txt",
        "43_failing_job.txt",
        "50_env_gpu2.txt",
        "51_env_2node_srun.txt",
        "52_env_gpus_option.txt",
    )
    for item in captures(name)
    if item.command.startswith("sbatch ")
]


def submit_in_order(golden_run: GoldenRun, name: str, command: str) -> tuple[Any, Any]:
    """Run the file's submissions up to `command` (a dependency names an earlier one)."""
    golden_run.submissions(name)
    for item in captures(name):
        if item.command.startswith("cat ") and item.command.endswith(".sh"):
            # The script a later case submits, as the capture shows it.
            with open(item.command.removeprefix("cat "), "w") as script:
                script.write(item.stdout)
        if item.command.startswith("sbatch ") and item.command != command:
            golden_run(name, item.command)
        if item.command == command:
            return golden_run(name, command)
    raise AssertionError(f"no {command} in {name}")


@compares(*SAME_SUBMISSIONS)
@pytest.mark.parametrize("case", SAME_SUBMISSIONS, ids=[c for _, c in SAME_SUBMISSIONS])
def test_a_submission_is_answered_as_slurm_answered_it(
    golden_run: GoldenRun, case: tuple[str, str]
) -> None:
    ours, slurm = submit_in_order(golden_run, *case)
    assert ours == slurm


NEVER_RUNNABLE = [
    ("13_sbatch_unsatisfiable_gres.txt", "sbatch --gres=gpu:9 --wrap true"),
    ("13_sbatch_unsatisfiable_gres.txt", "sbatch --parsable --gres=gpu:9 --wrap true"),
    ("13_sbatch_unsatisfiable_gres.txt", "sbatch --gres=gpu:h100:1 --wrap true"),
    ("13_sbatch_unsatisfiable_gres.txt", "sbatch --mem=600G --wrap true"),
    ("13_sbatch_unsatisfiable_gres.txt", "sbatch -c 65 --wrap true"),
]


@differs(*NEVER_RUNNABLE)
@pytest.mark.parametrize("case", NEVER_RUNNABLE, ids=[c for _, c in NEVER_RUNNABLE])
def test_a_request_that_can_never_run_says_why_after_slurms_sentence(
    golden_run: GoldenRun, case: tuple[str, str]
) -> None:
    golden_run.submissions(case[0])
    ours, slurm = golden_run(*case)
    sentence = "sbatch: error: Batch job submission failed: "
    sentence += "Requested node configuration is not available"
    assert (ours.stdout, ours.exit_code) == (slurm.stdout, slurm.exit_code) == ("", 1)
    # Slurm's last line is our first; why follows (Slurm says why for memory and CPUs
    # only, before it, in its own words).
    assert slurm.stderr.splitlines()[-1] == sentence
    first, why = ours.stderr.splitlines()
    assert first == sentence and why.startswith("sbatch: error: ")
    assert ours.stderr != slurm.stderr


@differs(("13_sbatch_unsatisfiable_gres.txt", "sbatch -N5 --gres=gpu:1 --wrap true"))
def test_more_nodes_than_the_partition_has_is_refused_where_slurm_queued_it(
    golden_run: GoldenRun,
) -> None:
    golden_run.submissions("13_sbatch_unsatisfiable_gres.txt")
    ours, slurm = golden_run(
        "13_sbatch_unsatisfiable_gres.txt", "sbatch -N5 --gres=gpu:1 --wrap true"
    )
    assert (slurm.exit_code, slurm.stdout) == (0, "Submitted batch job 7\n")
    assert (ours.exit_code, ours.stdout) == (1, "")
    assert ours.stderr.splitlines() == [
        "sbatch: error: Batch job submission failed: Requested node configuration is not available",
        "sbatch: error: 5 nodes requested, partition gpu has 4 that fit",
    ]


@differs(("53_srun_direct.txt", "srun --gres=gpu:9 true"))
def test_srun_of_a_never_runnable_request_says_why_after_slurms_sentence(
    golden_run: GoldenRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    golden_run.submissions("53_srun_direct.txt")
    ours, slurm = golden_run("53_srun_direct.txt", "srun --gres=gpu:9 true")
    assert (ours.exit_code, ours.stdout) == (slurm.exit_code, slurm.stdout) == (1, "")
    assert ours.stderr == slurm.stderr + (
        "srun: error: 9 GPUs per node requested, the largest node has 8\n"
    )
    assert golden_run.api.jobs == {}  # nothing was made


# -- the queue ---------------------------------------------------------------------------


@compares(("05_squeue_empty.txt", "squeue"), ("05_squeue_empty.txt", "squeue --noheader"))
def test_an_empty_queue(golden_run: GoldenRun) -> None:
    for command in ("squeue", "squeue --noheader"):
        ours, slurm = golden_run("05_squeue_empty.txt", command)
        assert ours == slurm


@compares(("13_sbatch_unsatisfiable_gres.txt", "scancel 7"))
def test_cancelling_a_pending_job_is_silent(golden_run: GoldenRun) -> None:
    pending = job(7, "wrap", "PENDING", reason="PartitionNodeLimit", num_nodes=5)
    golden_run.api.queue, golden_run.api.jobs[7] = [pending], pending
    ours, slurm = golden_run("13_sbatch_unsatisfiable_gres.txt", "scancel 7")
    assert ours == slurm


@compares(
    ("25_squeue_me.txt", "squeue -j 10,13"),
    ("26b_pending_reasons_after_backfill.txt", "squeue -t PD -o '%.8i %.10j %.8T %r'"),
    ("28_scontrol_show_job_running.txt", "scontrol show job 999999"),
)
def test_the_busy_clusters_queue(golden_run: GoldenRun) -> None:
    golden_run.api.queue = scene_jobs()
    for name, command in (
        ("25_squeue_me.txt", "squeue -j 10,13"),
        ("26b_pending_reasons_after_backfill.txt", "squeue -t PD -o '%.8i %.10j %.8T %r'"),
        ("28_scontrol_show_job_running.txt", "scontrol show job 999999"),
    ):
        ours, slurm = golden_run(name, command)
        assert ours == slurm, command


@compares(("25_squeue_me.txt", "squeue --start"))
def test_start_lists_the_pending_jobs_none_of_which_has_a_reservation(
    golden_run: GoldenRun,
) -> None:
    """The captured jobs run without a time limit, so no backfill reservation can say when
    the waiting ones start: N/A and (null), pending jobs only, in job id order."""
    golden_run.api.queue = scene_jobs()
    ours, slurm = golden_run("25_squeue_me.txt", "squeue --start")
    assert ours == slurm


def ended(j: dict[str, Any], state: str, **kw: Any) -> dict[str, Any]:
    return j | {"state": state, "end_time": NOW.strftime("%Y-%m-%dT%H:%M:%SZ"), **kw}


@compares(
    ("30_scancel_pending.txt", "scancel 14"),
    ("30_scancel_pending.txt", "squeue -j 14 -o '%i %T %r'"),
    ("31_scancel_running.txt", "scancel 12"),
    ("31_scancel_running.txt", "squeue -j 12 -o '%i %T %r'"),
    ("32_scancel_unknown.txt", "scancel 12"),
)
def test_a_cancelled_job_is_known_but_no_longer_listed(golden_run: GoldenRun) -> None:
    by_id = {j["job_id"]: j for j in scene_jobs()}
    golden_run.api.jobs = dict(by_id)
    golden_run.api.queue = list(by_id.values())
    assert golden_run("30_scancel_pending.txt", "scancel 14")[0].exit_code == 0
    by_id[14] = ended(by_id[14], "CANCELLED")
    golden_run.api.queue = list(by_id.values())
    ours, slurm = golden_run("30_scancel_pending.txt", "squeue -j 14 -o '%i %T %r'")
    assert ours == slurm
    for name, command in (
        ("30_scancel_pending.txt", "scancel 14"),
        ("31_scancel_running.txt", "scancel 12"),
    ):
        ours, slurm = golden_run(name, command)
        assert ours == slurm
    by_id[12] = ended(by_id[12], "CANCELLED", signal=15)
    golden_run.api.queue = list(by_id.values())
    ours, slurm = golden_run("31_scancel_running.txt", "squeue -j 12 -o '%i %T %r'")
    assert ours == slurm
    # Once more, when it is over: as silent.
    del golden_run.api.jobs[12]
    ours, slurm = golden_run("32_scancel_unknown.txt", "scancel 12")
    assert ours == slurm


@compares(
    ("33_dependency_release.txt", "scancel 10"),
    ("33_dependency_release.txt", "squeue -o '%i %j %T %R'"),
)
def test_a_dependency_that_can_never_be_met(golden_run: GoldenRun) -> None:
    by_id = {j["job_id"]: j for j in scene_jobs()}
    golden_run.api.jobs = dict(by_id)
    ours, slurm = golden_run("33_dependency_release.txt", "scancel 10")
    assert ours == slurm
    by_id[10] = ended(by_id[10], "CANCELLED", signal=15)
    by_id[12] = ended(by_id[12], "CANCELLED", signal=15)
    by_id[14] = ended(by_id[14], "CANCELLED")
    by_id[15] |= {"reason": "DependencyNeverSatisfied"}
    by_id[13] |= {
        "state": "RUNNING",
        "reason": "None",
        "nodes": ["gpu04"],
        "start_time": "2026-11-30T04:05:44Z",
    }
    golden_run.api.queue = list(by_id.values())
    ours, slurm = golden_run("33_dependency_release.txt", "squeue -o '%i %j %T %R'")
    assert ours == slurm


@compares(("40_timeout_job.txt", "scontrol show job 16 | grep -E 'JobState|RunTime|TimeLimit'"))
def test_a_job_that_just_started_shows_its_limit(golden_run: GoldenRun) -> None:
    started = job(16, "timeout", "RUNNING", nodes=["gpu01"], start=NOW, time_limit_min=1)
    golden_run.api.queue = [started | {"attempt": 1}]
    ours, slurm = golden_run(
        "40_timeout_job.txt", "scontrol show job 16 | grep -E 'JobState|RunTime|TimeLimit'"
    )
    assert ours == slurm


# -- the array 17 and the chain 18-21 (files 41, 42) --------------------------------------


def task(job_id: int, index: int, state: str = "PENDING", **kw: Any) -> dict[str, Any]:
    """A task of array 17; Spur numbers the tasks 17-20 at submit."""
    kw.setdefault("reason", "None")
    return job(job_id, "arr", state, gpus_per_node=1, array_job_id=17, array_task_id=index,
               array_throttle=2, **kw)  # fmt: skip


def array_scene() -> list[dict[str, Any]]:
    """File 41: 16 has just started, the four tasks of 17 wait."""
    timeout = job(16, "timeout", "RUNNING", nodes=["gpu01"], start=NOW - timedelta(seconds=2),
                  time_limit_min=1)  # fmt: skip
    return [timeout, *(task(17 + i, i) for i in range(4))]


ARRAY_SAME = [
    ("41_job_array.txt", "squeue"),
    ("41_job_array.txt", "squeue -o '%i %j %T %R'"),
]


@compares(*ARRAY_SAME)
def test_a_waiting_array_is_one_line(golden_run: GoldenRun) -> None:
    golden_run.api.queue = array_scene()
    for case in ARRAY_SAME:
        ours, slurm = golden_run(*case)
        assert ours == slurm, case


@differs(
    ("41_job_array.txt", "squeue -r -o '%i %A %F %K %j %T %R'"),
    ("41_job_array.txt", "squeue --array -j 17 -O JobID,ArrayJobID,ArrayTaskID,State,Reason"),
)
def test_each_waiting_task_has_its_own_job_id(golden_run: GoldenRun) -> None:
    golden_run.api.queue = array_scene()
    ours, slurm = golden_run("41_job_array.txt", "squeue -r -o '%i %A %F %K %j %T %R'")
    # Slurm's waiting tasks share the array's record (job id 17) until each starts.
    assert slurm.stdout.splitlines()[2] == "17_1 17 17 1 arr PENDING (None)"
    assert ours.stdout.splitlines()[2] == "17_1 18 17 1 arr PENDING (None)"
    assert (
        ours.stdout.replace(" 18 17 1", " 17 17 1")
        .replace(" 19 17 2", " 17 17 2")
        .replace(" 20 17 3", " 17 17 3")
        == slurm.stdout
    )
    command = "squeue --array -j 17 -O JobID,ArrayJobID,ArrayTaskID,State,Reason"
    ours, slurm = golden_run("41_job_array.txt", command)
    assert [line.split()[0] for line in slurm.stdout.splitlines()[1:]] == ["17"] * 4
    assert [line.split()[0] for line in ours.stdout.splitlines()[1:]] == ["17", "18", "19", "20"]


@differs(("41_job_array.txt", "scontrol show job 17 | grep -E '^JobId|ArrayTaskThrottle|JobState'"))
def test_show_job_of_a_waiting_array_shows_each_task(golden_run: GoldenRun) -> None:
    golden_run.api.queue = array_scene()
    command = "scontrol show job 17 | grep -E '^JobId|ArrayTaskThrottle|JobState'"
    ours, slurm = golden_run("41_job_array.txt", command)
    assert slurm.stdout.splitlines()[0].startswith("JobId=17 ArrayJobId=17 ArrayTaskId=0-3%2 ")
    heads = [line for line in ours.stdout.splitlines() if line.startswith("JobId=")]
    assert [h.split()[:3] for h in heads] == [
        [f"JobId={17 + i}", "ArrayJobId=17", f"ArrayTaskId={i}"] for i in range(4)
    ]


@compares(("41_job_array.txt", "sacct -j 17 --format=JobID,JobName,State,ExitCode,Elapsed"))
def test_the_history_of_an_array_lists_each_task_and_its_batch_step(golden_run: GoldenRun) -> None:
    start = NOW - timedelta(minutes=5)
    golden_run.api.history = [
        task(
            17 + i,
            i,
            "COMPLETED",
            nodes=["gpu01"],
            start=start,
            end=start + timedelta(seconds=20),
            exit_code=0,
            signal=0,
        )  # fmt: skip
        for i in range(4)
    ]
    ours, slurm = golden_run(
        "41_job_array.txt", "sacct -j 17 --format=JobID,JobName,State,ExitCode,Elapsed"
    )
    assert ours == slurm


# Spur numbered the array's tasks 17-20, so the chain is 21-24 where Slurm's is 18-21.
CHAIN = {18: 21, 19: 22, 20: 23, 21: 24}


def chain_scene(a_done: bool = False) -> list[dict[str, Any]]:
    running = NOW - timedelta(seconds=2)
    a = job(21, "chainA", "RUNNING", nodes=["gpu01"], start=running)
    if a_done:
        a = ended(a, "COMPLETED", exit_code=0, signal=0)
    return [
        job(16, "timeout", "RUNNING", nodes=["gpu01"], start=running, time_limit_min=1),
        task(17, 0, "RUNNING", nodes=["gpu01"], start=running),
        task(18, 1, "RUNNING", nodes=["gpu01"], start=running),
        task(19, 2, reason="JobArrayTaskLimit"),
        task(20, 3, reason="JobArrayTaskLimit"),
        a,
        job(22, "chainB", "PENDING", reason="Dependency", dependency="afterok:21(unfulfilled)"),
        job(23, "chainC", "PENDING", reason="Dependency", dependency="afterok:22(unfulfilled)"),
        job(
            24,
            "chainX",
            "PENDING",
            reason="DependencyNeverSatisfied" if a_done else "Dependency",
            dependency=f"afternotok:21({'failed' if a_done else 'unfulfilled'})",
        ),  # fmt: skip
    ]


CHAIN_SAME = [
    ("42_dependency_chain.txt", "squeue -o '%i %j %T %R %E'"),
    ("42_dependency_chain.txt", "scontrol show job 20 | grep -E 'JobState|Dependency'"),
]


@compares(*CHAIN_SAME)
def test_a_chain_of_dependencies_waits_as_in_slurm(golden_run: GoldenRun) -> None:
    golden_run.api.queue = chain_scene()
    for case in CHAIN_SAME:
        ours, slurm = golden_run(*case, ids=CHAIN)
        assert ours == slurm, case


@compares(
    ("42_dependency_chain.txt", "squeue -j 21 -o '%i %j %T %r %E'"),
    ("42_dependency_chain.txt", "scancel 21"),
)
def test_a_dependency_on_success_that_failed_never_runs_and_is_cancelled(
    golden_run: GoldenRun,
) -> None:
    golden_run.api.queue = chain_scene(a_done=True)
    golden_run.api.jobs = {j["job_id"]: j for j in golden_run.api.queue}
    for command in ("squeue -j 21 -o '%i %j %T %r %E'", "scancel 21"):
        ours, slurm = golden_run("42_dependency_chain.txt", command, ids=CHAIN)
        assert ours == slurm, command


# -- history, versions, configuration ------------------------------------------------------


@compares(
    ("63_sacct_misc.txt", "sacct -X -n -P -o JobID,State,ExitCode -S now-1hours -s CD,F,TO,CA")
)
def test_states_without_an_end_ask_for_one_moment_and_find_nothing(golden_run: GoldenRun) -> None:
    ran = NOW - timedelta(minutes=10)
    done = dict(nodes=["gpu01"], start=ran, end=ran + timedelta(seconds=5), signal=0)
    golden_run.api.history = [
        job(1, "wrap", "COMPLETED", exit_code=0, **done),
        job(24, "fail3", "FAILED", exit_code=3, **done),
        job(16, "timeout", "TIMEOUT", exit_code=0, **done | {"signal": 15}),
        job(14, "wait_prio", "CANCELLED", exit_code=0, end=ran),
    ]
    command = "sacct -X -n -P -o JobID,State,ExitCode -S now-1hours -s CD,F,TO,CA"
    ours, slurm = golden_run("63_sacct_misc.txt", command)
    assert ours == slurm


VERSIONS = (
    "sinfo --version; sbatch --version; squeue --version; scontrol --version; sacct --version"
)


@differs(("70_versions.txt", VERSIONS))
def test_each_command_names_slurms_version_as_upstream_slurm_does(golden_run: GoldenRun) -> None:
    ours, slurm = golden_run("70_versions.txt", VERSIONS)
    # The capture's Slurm is Debian's build, which calls itself slurm-wlm.
    assert slurm.stdout == "slurm-wlm 22.05.8\n" * 5
    assert ours == slurm.__class__(VERSIONS, "slurm 22.05.8\n" * 5, "", 0)


CONFIG = (
    "scontrol show config | grep -E '^(SelectType|GresTypes|TopologyPlugin|ProctrackType|"
    "TaskPlugin|SchedulerType|PriorityType|AccountingStorageType|MinJobAge|MaxJobCount)'"
)


@differs(("70_versions.txt", CONFIG))
def test_the_configuration_says_what_spur_is_where_it_is_not_slurms(
    golden_run: GoldenRun,
) -> None:
    from scheduler.ctld.controller import MIN_JOB_AGE_S
    from spurcloud.api.cluster import config_pairs

    pairs = config_pairs({"cluster_name": "spur", "min_job_age_s": MIN_JOB_AGE_S})
    golden_run.api.config = {k: v for k, v in pairs.items() if k != "ClusterName"}
    ours, slurm = golden_run("70_versions.txt", CONFIG)
    same = set(ours.stdout.splitlines()) & set(slurm.stdout.splitlines())
    assert sorted(line.split()[0] for line in same) == [
        "GresTypes", "MinJobAge", "SchedulerType", "SelectType"
    ]  # fmt: skip
    # Our accounting and priority are our own; the daemons' plugins are not Spur's.
    assert [line.split()[0] for line in ours.stdout.splitlines() if line not in same] == [
        "AccountingStorageType", "PriorityType"
    ]  # fmt: skip
