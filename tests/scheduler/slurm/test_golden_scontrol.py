"""scontrol show job|node|partition|hostnames|hostlist against Slurm 22.05's captures
(golden files 02, 03, 04, 26, 28, 29, 30, 31, 40, 41, 43), after normalising what differs
from run to run (ids, times, priorities, the submitting shell's pid).

Differences left, each normalised below with its reason:
- `UserId=root(0) GroupId=root(0)`: the user's uid and gid are not in the job object (a
  tenant's jobs run under the organisation's uid, which the API does not reveal); we
  print the user name with `(0)`. The names are normalised anyway (README: user names).
- `AllocNode:Sid=localhost:6906`: the submitting shell's pid is not recorded; we print
  the submit host and `0`.
- `show node`: what only the node's operating system knows and Spur does not report
  (Arch, CPULoad, NodeAddr/NodeHostName/Port, OS, FreeMem, BootTime, SlurmdStartTime,
  LastBusyTime) reads as Slurm reads an unknown value: `(null)`, `N/A`, `None`.
- A pending job submitted without `--mem` has no memory yet: Spur decides it at placement
  (the node's memory per CPU, placement._mem), so its TRES lacks `mem=` and it reads
  `MinMemoryNode=0` where Slurm (with DefMemPerCPU) prints `mem=8G` and `MinMemoryCPU=8G`.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from scheduler.cli import scontrol
from scheduler.cli.console import UsageError
from scheduler.slurm.scontrol_format import (
    gpu_models,
    job_record,
    node_record,
    partition_record,
    render,
    topology_lines,
)
from tests.scheduler.slurm.golden import capture, compares, differs
from tests.scheduler.slurm.scene import NOW, job, node, nodes, partitions

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
# What differs from run to run, or what Spur cannot know (the module docstring says why).
MACHINE_FACTS = re.compile(
    r"(Priority|UserId|GroupId|AllocNode:Sid|Arch|CPULoad|NodeAddr|NodeHostName|Port|"
    r"FreeMem|BootTime|SlurmdStartTime|LastBusyTime)=\S*"
)
KERNEL = re.compile(r"^   OS=.*$", re.MULTILINE)


def normal(text: str) -> str:
    text = STAMP.sub("<time>", text)
    text = MACHINE_FACTS.sub(lambda m: f"{m.group(1)}=<x>", text)
    text = KERNEL.sub("   OS=<x>", text)
    # Slurm prints Version= and Port= only where it knows them: keep the line's shape.
    return text.replace(" Port=<x>", "").replace(" Version=22.05.8", "")


def scene_job(job_id: int) -> dict[str, Any]:
    started = NOW - timedelta(seconds=3)
    if job_id == 10:
        j = job(10, "big2n", "RUNNING", nodes=["gpu01", "gpu02"], num_nodes=2, num_cpus=2,
                gpus_per_node=8, start=started)  # fmt: skip
        j["spec"]["ntasks"] = 2
    elif job_id == 12:
        j = job(12, "six", "RUNNING", nodes=["gpu04"], gpus_per_node=6, start=started)
        j["allocation"]["gpu04"]["cpu_ids"] = [0]
    elif job_id == 15:
        j = job(15, "wait_dep", "PENDING", reason="Dependency", gpus_per_node=1,
                dependency="afterok:10(unfulfilled)")  # fmt: skip
    else:
        name, reason = {13: ("wait_res", "Resources"), 14: ("wait_prio", "Priority")}[job_id]
        j = job(job_id, name, "PENDING", reason=reason, gpus_per_node=4)
    for part in j["allocation"].values():
        part["mem_mb"] = 8192 * part["cpus"]
    j["attempt"] = 1 if j["start_time"] else 0
    j["stdin"] = ""
    return j


def show_job(j: dict[str, Any], *, details: bool = False) -> str:
    models = gpu_models(nodes())
    return render([job_record(j, now=NOW, details=details, node_models=models)])


@compares(("28_scontrol_show_job_running.txt", "scontrol show job 10"))
def test_show_job_of_a_running_two_node_job_matches_slurm(utc: None) -> None:
    expected = capture("28_scontrol_show_job_running.txt", "scontrol show job 10").stdout
    assert normal(show_job(scene_job(10))) == normal(expected)


@compares(("28_scontrol_show_job_running.txt", "scontrol show job -d 12"))
def test_show_job_with_details_lists_each_nodes_cpus_memory_and_gpu_indices(utc: None) -> None:
    expected = capture("28_scontrol_show_job_running.txt", "scontrol show job -d 12").stdout
    assert normal(show_job(scene_job(12), details=True)) == normal(expected)


@differs(*(("26_pending_reasons.txt", f"scontrol show job {i}") for i in (13, 14, 15)))
@pytest.mark.parametrize("job_id", [13, 14, 15])
def test_show_job_of_a_pending_job_matches_slurm_but_for_its_memory(utc: None, job_id: int) -> None:
    expected = capture("26_pending_reasons.txt", f"scontrol show job {job_id}").stdout
    ours = normal(show_job(scene_job(job_id)))
    slurm = normal(expected).replace(",mem=8G", "").replace("MinMemoryCPU=8G", "MinMemoryNode=0")
    if job_id == 15:  # not yet eligible: its dependency is unmet
        slurm = slurm.replace("EligibleTime=Unknown", "EligibleTime=<time>")
        slurm = slurm.replace("AccrueTime=Unknown", "AccrueTime=<time>")
    assert ours == slurm
    assert ours != normal(expected)


def grep(text: str, pattern: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if re.search(pattern, line))


@compares(
    ("30_scancel_pending.txt", "scontrol show job 14 | grep -E 'JobState|ExitCode'"),
    ("31_scancel_running.txt", "scontrol show job 12 | grep -E 'JobState|ExitCode'"),
)
def test_a_job_cancelled_while_pending_exits_0_0_and_one_cancelled_running_0_15(
    utc: None,
) -> None:
    pending = scene_job(14) | {"state": "CANCELLED", "end_time": "2026-11-30T04:05:50Z"}
    running = scene_job(12) | {"state": "CANCELLED", "reason": "None", "signal": 15}
    for j, name, job_id in ((pending, "30_scancel_pending.txt", 14),
                            (running, "31_scancel_running.txt", 12)):  # fmt: skip
        command = f"scontrol show job {job_id} | grep -E 'JobState|ExitCode'"
        assert grep(show_job(j), "JobState|ExitCode") == capture(name, command).stdout


@compares(
    ("40_timeout_job.txt", "scontrol show job 16 | grep -E 'JobState|RunTime|TimeLimit|ExitCode'")
)
def test_a_timed_out_job_shows_its_limit_run_time_and_signal(utc: None) -> None:
    start = NOW - timedelta(seconds=68)
    j = job(16, "to", "TIMEOUT", reason="TimeLimit", nodes=["gpu01"], start=start, end=NOW,
            time_limit_min=1, signal=15)  # fmt: skip
    j["attempt"] = 1
    command = "scontrol show job 16 | grep -E 'JobState|RunTime|TimeLimit|ExitCode'"
    expected = capture("40_timeout_job.txt", command).stdout
    assert grep(show_job(j), "JobState|RunTime|TimeLimit|ExitCode") == expected


@compares(("43_failing_job.txt", "scontrol show job 24 | grep -E 'JobState|ExitCode'"))
def test_a_failed_job_shows_its_exit_code(utc: None) -> None:
    j = job(24, "f", "FAILED", reason="NonZeroExitCode", nodes=["gpu01"],
            start=NOW - timedelta(seconds=1), end=NOW, exit_code=3, signal=0)  # fmt: skip
    command = "scontrol show job 24 | grep -E 'JobState|ExitCode'"
    assert grep(show_job(j), "JobState|ExitCode") == capture("43_failing_job.txt", command).stdout


@compares(("41_job_array.txt", "scontrol show job 17_0 | head -3"))
def test_an_array_task_heads_its_record_with_the_array_ids_and_throttle(utc: None) -> None:
    j = job(17, "arr", "RUNNING", nodes=["gpu01"], start=NOW, array_job_id=17, array_task_id=0,
            array_throttle=2)  # fmt: skip
    expected = capture("41_job_array.txt", "scontrol show job 17_0 | head -3").stdout
    assert normal("".join(show_job(j).splitlines(keepends=True)[:3])) == normal(expected)


@compares(
    ("02_scontrol_show_node_gpu01_idle.txt", "scontrol show node gpu01"),
    ("29_scontrol_show_node_gpu01_busy.txt", "scontrol show node gpu01"),
)
def test_show_node_idle_and_busy_match_slurm_but_for_machine_facts() -> None:
    idle = capture("02_scontrol_show_node_gpu01_idle.txt", "scontrol show node gpu01").stdout
    assert normal(render([node_record(node("gpu01"))])) == normal(idle)
    busy = node("gpu01", "mix", 1) | {"memory_alloc_mb": 8192, "gpus_alloc": 8}
    expected = capture("29_scontrol_show_node_gpu01_busy.txt", "scontrol show node gpu01").stdout
    assert normal(render([node_record(busy)])) == normal(expected)


@compares(("29_scontrol_show_node_gpu01_busy.txt", "scontrol show node gpu04"))
def test_show_node_of_a_node_with_six_of_its_gpus_held() -> None:
    six = node("gpu04", "mix", 1) | {"memory_alloc_mb": 8192, "gpus_alloc": 6}
    expected = capture("29_scontrol_show_node_gpu01_busy.txt", "scontrol show node gpu04").stdout
    assert normal(render([node_record(six)])) == normal(expected)


@compares(
    ("03_scontrol_show_partition.txt", "scontrol show partition"),
    ("03_scontrol_show_partition.txt", "scontrol show partition gpu"),
)
def test_show_partition_matches_slurm_byte_for_byte() -> None:
    out = render([partition_record(p, nodes()) for p in partitions()])
    golden = "03_scontrol_show_partition.txt"
    assert out == capture(golden, "scontrol show partition").stdout
    assert out == capture(golden, "scontrol show partition gpu").stdout


def test_one_liner_puts_each_record_on_one_line() -> None:
    out = render([partition_record(p, nodes()) for p in partitions()], one_liner=True)
    assert out.count("\n") == 1
    assert out.startswith("PartitionName=gpu AllowGroups=ALL ")


@compares(
    ("04_scontrol_show_hostnames.txt", "scontrol show hostnames gpu[01-03]"),
    ("04_scontrol_show_hostnames.txt", "scontrol show hostlist gpu01,gpu02,gpu03"),
)
def test_show_hostnames_and_hostlist_match_slurm(capsys: pytest.CaptureFixture[str]) -> None:
    golden = "04_scontrol_show_hostnames.txt"
    for command in (
        "scontrol show hostnames gpu[01-03]",
        "scontrol show hostlist gpu01,gpu02,gpu03",
    ):
        assert scontrol.main(command.split()[1:]) == 0
        assert capsys.readouterr().out == capture(golden, command).stdout


def test_show_hostnames_reads_the_jobs_node_list_when_given_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.setenv("SLURM_NODELIST", "gpu[03-04]")
    assert scontrol.main(["show", "hostnames"]) == 0
    assert capsys.readouterr().out == "gpu03\ngpu04\n"
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    assert scontrol.main(["show", "hostnames"]) == 0
    assert capsys.readouterr().out == "n1\nn2\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["frobnicate"], "invalid keyword: frobnicate"),
        (["show", "widgets"], "invalid entity: widgets for keyword: show"),
        (["show"], "too few arguments for keyword:show"),
        (["hold"], "too few arguments for keyword:hold"),
        (["hold", "12x"], "Invalid job id specified: 12x"),
        (
            ["update", "JobId=5", "Features=a"],
            "Update of this parameter is not supported: Features=a",
        ),
        (["update", "JobId=5", "TimeLimit=soon"], "Invalid TimeLimit value: soon"),
    ],
)
def test_bad_commands_get_slurms_message_and_exit_1(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert scontrol.main(argv) == 1
    assert capsys.readouterr().err.splitlines()[0] == message


def test_an_unknown_option_gets_getopts_message_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert scontrol.main(["--frob", "ping"]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "scontrol: unrecognized option '--frob'\nTry \"scontrol --help\" for more information\n"
    )


def test_update_takes_the_keys_a_tenant_may_change() -> None:
    args = scontrol.parse_args(
        ["update", "JobId=7", "TimeLimit=1:30:00", "JobName=x", "Nice=5", "Partition=p",
         "Comment=hi there"], {}
    )  # fmt: skip
    assert [r.job_id for r in args.job_refs] == [7]
    assert args.update == {"time_limit_min": 90, "name": "x", "nice": 5, "partition": "p",
                           "comment": "hi there"}  # fmt: skip


def test_parse_errors_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        scontrol.parse_args(["update", "TimeLimit=5"], {})


def test_options_may_follow_the_command_as_in_the_captures() -> None:
    args = scontrol.parse_args(["show", "job", "-d", "12"], {})
    assert (args.entity, args.details, [r.job_id for r in args.job_refs]) == ("job", True, [12])
    args = scontrol.parse_args(["-o", "show", "part"], {})
    assert (args.entity, args.one_liner) == ("partition", True)


@compares(("04_scontrol_show_hostnames.txt", "scontrol show topology"))
def test_show_topology_matches_slurm_byte_for_byte() -> None:
    from scheduler.core.commands import ConfigurePolicy
    from scheduler.core.policy import Policy
    from scheduler.core.shares import policy_report
    from scheduler.core.state import ClusterState

    state = ClusterState()
    tree = {"switches": {"leaf1": {"nodes": "gpu[01-02]"}, "leaf2": {"nodes": "gpu[03-04]"},
                         "spine": {"switches": "leaf[1-2]"}}}  # fmt: skip
    state.apply(ConfigurePolicy("c1", 0.0, Policy(topology=tree)))
    switches = policy_report(state, 0.0)["switches"]
    expected = capture("04_scontrol_show_hostnames.txt", "scontrol show topology").stdout
    assert "".join(line + "\n" for line in topology_lines(switches)) == expected
