"""The launcher runs real processes, each in its sandbox as its organisation's identity:
bash scripts that write, sleep, fail and get killed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents import jobprocess, jobrecord
from agents.identity import Identity
from agents.launcher import InvalidLaunch, Launcher, LaunchRequest
from agents.supervisor import supervisors_of
from tests.agents.conftest import RecordingReporter
from tests.fixtures.platform import job_processes, processes_gone
from tests.fixtures.processes import wait_until

Payload = Callable[..., dict[str, Any]]
Launch = Callable[[dict[str, Any]], bool]
Put = Callable[..., Path]


def _gone(marker: str, timeout: float = 5.0) -> bool:
    return processes_gone(marker, timeout)


def _forget(jobdir: Path, fact: str) -> None:
    """As if the job's record had never been given `fact` (its first key): the agent or
    the supervisor that would have written it died first."""
    record = jobdir / "launch.json"
    kept = [line for line in record.read_text().split("\n") if not line.startswith(f'{{"{fact}":')]
    record.write_text("\n".join(kept))


def _wait_for_file(path: Path, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def another_launcher(launcher: Launcher, tmp_path: Path, reporter: Any) -> Launcher:
    """A new agent on the same spool and work root (the old one restarted)."""
    return Launcher(
        node="sim01",
        spool_dir=tmp_path / "spool",
        reporter=reporter,
        work_root=launcher.workspaces.root,
        identities=launcher.identities,
    )


def test_a_script_runs_in_its_submit_dir_and_writes_the_default_output_file(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = "#!/bin/bash\necho hello from $SLURM_JOB_ID in $(pwd)\necho oops >&2\n"
    assert launch(payload(7, script, submit_dir=str(workspace))) is False
    assert launcher.wait(7, 1, timeout=10)
    out = (workspace / "slurm-7.out").read_text()
    assert f"hello from 7 in {workspace}" in out
    assert "oops" in out  # no --error: stderr goes to the same file
    kinds = [r["kind"] for r in reporter.reports]
    assert kinds == ["started", "finished"]
    assert reporter.reports[0]["pid"] > 0
    assert reporter.reports[0]["limits"] in ("rlimit", "cgroup2")
    assert reporter.finished(7) == {
        "kind": "finished",
        "job_id": 7,
        "attempt": 1,
        "node": "sim01",
        "exit_code": 0,
        "signal": 0,
        "reason": "",
        "oom": False,
    }


def test_the_job_sees_its_exported_environment_and_the_slurm_variables(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path, identity: Identity
) -> None:
    script = "#!/bin/bash\nenv > env.txt\n"
    p = payload(8, script, submit_dir=str(workspace), gpus=[2, 3], environment={"MY_VAR": "x y"})
    launch(p)
    assert launcher.wait(8, 1, timeout=10)
    env = dict(
        line.split("=", 1)
        for line in (workspace / "env.txt").read_text().splitlines()
        if "=" in line
    )
    assert env["MY_VAR"] == "x y"
    assert env["SLURM_JOB_ID"] == "8"
    assert env["SLURM_CLUSTER_NAME"] == "testcluster"
    assert env["SLURMD_NODENAME"] == "sim01"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["SLURM_JOB_GPUS"] == "2,3"
    assert (env["SLURM_JOB_UID"], env["SLURM_JOB_GID"]) == (str(identity.uid), str(identity.gid))
    assert (env["USER"], env["HOME"], env["TMPDIR"]) == (identity.name, str(workspace), "/tmp")
    assert "PATH" in env


def test_stdin_is_empty_and_stderr_can_go_to_its_own_file(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = "#!/bin/bash\ncat\necho out\necho err >&2\n"
    p = payload(9, script, workdir=str(workspace), stdout="o-%j.txt", stderr="e-%j.txt")
    launch(p)
    assert launcher.wait(9, 1, timeout=10)
    assert (workspace / "o-9.txt").read_text() == "out\n"
    assert (workspace / "e-9.txt").read_text() == "err\n"


def test_stdin_can_come_from_a_file_of_the_workspace(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path, put: Put
) -> None:
    put(workspace / "in.txt", "from the input file\n")
    launch(payload(31, "#!/bin/bash\ncat\n", workdir=".", stdin="in.txt"))
    assert launcher.wait(31, 1, timeout=10)
    assert (workspace / "slurm-31.out").read_text() == "from the input file\n"


def test_output_is_appended_like_slurms_default_open_mode(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path, put: Put
) -> None:
    put(workspace / "slurm-10.out", "before\n")
    launch(payload(10, "#!/bin/bash\necho after\n", submit_dir=str(workspace)))
    assert launcher.wait(10, 1, timeout=10)
    assert (workspace / "slurm-10.out").read_text() == "before\nafter\n"


def test_the_exit_code_is_reported(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(11, "#!/bin/bash\nexit 3\n"))
    assert launcher.wait(11, 1, timeout=10)
    assert (reporter.finished(11)["exit_code"], reporter.finished(11)["signal"]) == (3, 0)


def test_an_exit_code_above_128_is_not_taken_for_a_signal_nobody_sent(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(32, "#!/bin/bash\nexit 143\n"))
    assert launcher.wait(32, 1, timeout=10)
    assert (reporter.finished(32)["exit_code"], reporter.finished(32)["signal"]) == (143, 0)


def test_the_script_is_kept_in_the_spool_and_the_job_runs_a_read_only_copy(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = (
        "#!/bin/bash\nstat -c %a /run/spur/job/script\n"
        "(echo changed > /run/spur/job/script) 2>/dev/null || echo refused\n"
    )
    launch(payload(12, script, workdir=str(workspace)))
    assert launcher.wait(12, 1, timeout=10)
    kept = jobrecord.read(tmp_path / "spool" / "jobs" / "12.1").launch
    assert kept["job"]["spec"]["script"] == script
    assert (workspace / "slurm-12.out").read_text().split() == ["555", "refused"]


def test_a_second_launch_of_the_same_attempt_is_a_duplicate_and_runs_nothing(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    p = payload(13, "#!/bin/bash\necho run >> runs.txt\n", workdir=str(workspace))
    assert launch(p) is False
    assert launch(p) is True
    assert launcher.wait(13, 1, timeout=10)
    assert (workspace / "runs.txt").read_text() == "run\n"
    assert [r["kind"] for r in reporter.reports] == ["started", "finished"]


def test_a_restarted_agent_does_not_run_an_attempt_its_predecessor_ran(
    tmp_path: Path,
    launcher: Launcher,
    reporter: Any,
    payload: Payload,
    launch: Launch,
    workspace: Path,
) -> None:
    p = payload(14, "#!/bin/bash\necho run >> runs.txt\n", workdir=str(workspace))
    launch(p)
    assert launcher.wait(14, 1, timeout=10)
    again = another_launcher(launcher, tmp_path, reporter)
    assert again.launch(LaunchRequest.from_payload(p)) is True
    time.sleep(0.2)
    assert (workspace / "runs.txt").read_text() == "run\n"


def test_a_different_job_reusing_an_id_moves_the_old_directory_aside(
    tmp_path: Path,
    launcher: Launcher,
    reporter: Any,
    payload: Payload,
    launch: Launch,
    workspace: Path,
) -> None:
    p = payload(15, "#!/bin/bash\necho run >> runs.txt\n", workdir=str(workspace))
    launch(p)
    assert launcher.wait(15, 1, timeout=10)
    again = another_launcher(launcher, tmp_path, reporter)
    p["job"]["submit_time"] += 1000  # the controller's state was wiped: a new job 15
    assert again.launch(LaunchRequest.from_payload(p)) is False
    assert again.wait(15, 1, timeout=10)
    assert (workspace / "runs.txt").read_text() == "run\nrun\n"


def test_a_new_attempt_runs_again(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = "#!/bin/bash\necho $SLURM_RESTART_COUNT >> runs.txt\n"
    launch(payload(16, script, workdir=str(workspace), attempt=1))
    assert launcher.wait(16, 1, timeout=10)
    launch(payload(16, script, workdir=str(workspace), attempt=2))
    assert launcher.wait(16, 2, timeout=10)
    assert (workspace / "runs.txt").read_text() == "0\n1\n"


def test_only_the_first_node_runs_the_batch_script(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    p = payload(17, "#!/bin/bash\necho ran\n", workdir=str(workspace), nodes=["sim00", "sim01"])
    assert launch(p) is False
    assert launch(p) is True
    time.sleep(0.2)
    assert not (workspace / "slurm-17.out").exists()
    assert reporter.reports == []
    assert launcher.running() == []


def test_a_job_submitted_from_outside_the_workspace_runs_in_a_directory_of_its_own(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    elsewhere = "/home/alice/work"
    launch(payload(18, "#!/bin/bash\npwd\necho $SLURM_SUBMIT_DIR\n", submit_dir=elsewhere))
    assert launcher.wait(18, 1, timeout=10)
    own = workspace / "jobs" / "18"
    assert (own / "slurm-18.out").read_text() == f"{own}\n{elsewhere}\n"


def test_a_relative_workdir_is_taken_in_the_workspace(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path, put: Put
) -> None:
    put(workspace / "project", None)
    launch(payload(33, "#!/bin/bash\npwd\n", workdir="project", submit_dir="/elsewhere"))
    assert launcher.wait(33, 1, timeout=10)
    assert (workspace / "project" / "slurm-33.out").read_text() == f"{workspace}/project\n"


def test_an_output_file_that_cannot_be_opened_fails_the_launch_with_exit_code_1(
    tmp_path: Path,
    launcher: Launcher,
    reporter: Any,
    payload: Payload,
    launch: Launch,
    workspace: Path,
) -> None:
    p = payload(19, "#!/bin/bash\necho x\n", workdir=str(workspace), stdout="nodir/out")
    assert launch(p) is False
    assert launcher.wait(19, 1, timeout=5)
    finished = reporter.finished(19)
    assert (finished["exit_code"], finished["signal"]) == (1, 0)
    assert f"{workspace}/nodir/out" in finished["reason"]
    assert [r["kind"] for r in reporter.reports] == ["finished"]
    error = tmp_path / "spool" / "jobs" / "19.1" / "launch-error"
    assert "the job could not start: cannot create" in error.read_text()


def test_a_workdir_that_is_a_file_fails_the_launch_and_says_so(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path, put: Put
) -> None:
    put(workspace / "afile")
    launch(payload(20, "#!/bin/bash\necho x\n", workdir="afile"))
    assert launcher.wait(20, 1, timeout=5)
    assert reporter.finished(20)["exit_code"] == 1
    assert "not a directory" in reporter.finished(20)["reason"]


@pytest.mark.parametrize("script", ["#!/nonexistent/interpreter\necho x\n", "echo no shebang\n"])
def test_a_script_that_cannot_be_executed_fails_the_launch(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, script: str
) -> None:
    launch(payload(21, script))
    assert launcher.wait(21, 1, timeout=5)
    assert reporter.finished(21)["exit_code"] == 1
    assert "cannot execute the batch script" in reporter.finished(21)["reason"]
    error = tmp_path / "spool" / "jobs" / "21.1" / "launch-error"
    assert "cannot execute the batch script" in error.read_text()


def test_a_signal_reaches_every_process_of_the_job(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    # The child starts a session of its own: it leaves the script's process group, not
    # the job's PID namespace.
    script = "#!/bin/bash\nsetsid sleep 6122 &\necho started > started.txt\nwait\n"
    launch(payload(22, script, workdir=str(workspace)))
    _wait_for_file(workspace / "started.txt")
    assert job_processes("sleep 6122")
    assert launcher.running()[0]["job_id"] == 22
    assert launcher.signal(22, 1, signal.SIGTERM) is True
    assert launcher.wait(22, 1, timeout=10)
    finished = reporter.finished(22)
    assert (finished["exit_code"], finished["signal"]) == (0, signal.SIGTERM)
    assert _gone("sleep 6122")
    assert launcher.running() == []


@pytest.mark.parametrize("children", [True, False], ids=["descendants", "all-of-proc"])
def test_a_signal_reaches_an_orphan_the_init_adopted_and_no_other_jobs_process(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path,
    monkeypatch: pytest.MonkeyPatch, children: bool,
) -> None:  # fmt: skip
    # Found as the init's descendants (or, where the kernel lists no children, in all of
    # /proc): a double fork leaves a process whose parent is the init, in no session or
    # group of the script's; the script itself ignores SIGTERM and goes on.
    if children and not jobprocess._CHILDREN:
        pytest.skip("the kernel lists no process's children")
    monkeypatch.setattr(jobprocess, "_CHILDREN", children)
    orphan = "trap 'echo got-term > orphan.txt; exit' TERM; while :; do sleep 0.05; done"
    script = (
        f'#!/bin/bash\n(setsid bash -c "{orphan}" &)\n'
        "trap '' TERM\necho started > started.txt\n"
        "while [ ! -e stop ]; do sleep 0.05; done\n"
    )
    other = "#!/bin/bash\ntrap 'echo got-term > other.txt' TERM\necho started > o.txt\n"
    other += "while :; do sleep 0.05; done\n"
    launch(payload(26, script, workdir=str(workspace)))
    launch(payload(27, other, workdir=str(workspace)))
    _wait_for_file(workspace / "started.txt")
    _wait_for_file(workspace / "o.txt")
    try:
        assert launcher.signal(26, 1, signal.SIGTERM) is True
        assert _wait_for_file(workspace / "orphan.txt") == "got-term\n"
        # The script ignored it and runs on.
        assert 26 in [job["job_id"] for job in launcher.running()]
        assert not (workspace / "other.txt").exists()  # another job's got nothing
    finally:
        (workspace / "stop").touch()
        launcher.kill_all()


def test_a_job_that_ignores_sigterm_is_killed_after_kill_after_s(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = "#!/bin/bash\ntrap 'echo got TERM' TERM\necho ready\nwhile true; do sleep 0.05; done\n"
    launch(payload(23, script, workdir=str(workspace)))
    _wait_for_file(workspace / "slurm-23.out")
    started = time.monotonic()
    assert launcher.signal(23, 1, signal.SIGTERM, kill_after_s=0.5) is True
    assert launcher.wait(23, 1, timeout=10)
    assert time.monotonic() - started >= 0.45
    assert reporter.finished(23)["signal"] == signal.SIGKILL
    assert "got TERM" in (workspace / "slurm-23.out").read_text()


def test_a_stopped_job_still_ends_on_sigterm(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    launch(payload(24, "#!/bin/bash\necho ready\nsleep 60\n", workdir=str(workspace)))
    _wait_for_file(workspace / "slurm-24.out")
    assert launcher.signal(24, 1, signal.SIGSTOP)
    assert launcher.signal(24, 1, signal.SIGTERM)
    assert launcher.wait(24, 1, timeout=10)
    assert reporter.finished(24)["signal"] == signal.SIGTERM


def test_processes_left_behind_by_the_script_are_killed_when_it_ends(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = "#!/bin/bash\nsetsid sleep 6125 &\nsleep 0.2\n"
    launch(payload(25, script, workdir=str(workspace)))
    assert launcher.wait(25, 1, timeout=10)
    assert _gone("sleep 6125", timeout=0.5)


def test_signalling_an_unknown_or_finished_job_delivers_nothing(
    launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    assert launcher.signal(99, 1, signal.SIGTERM) is False
    launch(payload(26, "#!/bin/bash\ntrue\n"))
    assert launcher.wait(26, 1, timeout=10)
    assert launcher.signal(26, 1, signal.SIGTERM) is False


def test_a_launch_for_another_node_is_refused(launcher: Launcher, payload: Payload) -> None:
    p = payload(27, "#!/bin/bash\n", node="sim02")
    with pytest.raises(InvalidLaunch):
        launcher.launch(LaunchRequest.from_payload(p))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p.pop("job"), "job must be an object"),
        (lambda p: p.update(job_id="7"), "job_id"),
        (lambda p: p.update(attempt=-1), "attempt"),
        (lambda p: p["job"].update(nodes=[]), "job.nodes"),
        (lambda p: p["job"]["spec"].update(bogus=1), "unknown job field"),
        (lambda p: p["job"].pop("spec"), "job.spec"),
        (lambda p: p.update(node="elsewhere"), "not one of the job's nodes"),
    ],
)
def test_a_malformed_payload_is_refused_with_a_message(
    payload: Payload, mutate: Callable[[dict[str, Any]], Any], message: str
) -> None:
    p = payload(28, "#!/bin/bash\n")
    mutate(p)
    with pytest.raises(InvalidLaunch, match=message):
        LaunchRequest.from_payload(p)


def test_a_restarted_agent_adopts_a_job_that_still_runs_and_reports_its_end(
    tmp_path: Path,
    launcher: Launcher,
    reporter: Any,
    payload: Payload,
    launch: Launch,
    workspace: Path,
) -> None:
    launch(payload(29, "#!/bin/bash\necho ready\nexec sleep 6129\n", workdir=str(workspace)))
    _wait_for_file(workspace / "slurm-29.out")
    pid = launcher.running()[0]["pid"]
    # A new agent on the same spool; the old one is gone without a word.
    later = RecordingReporter()
    again = another_launcher(launcher, tmp_path, later)
    assert again.recover(poll_s=0.02) == [(29, 1)]
    assert again.running() == [{"job_id": 29, "attempt": 1, "pid": pid}]
    assert again.launch(LaunchRequest.from_payload(payload(29, "x"))) is True
    assert again.signal(29, 1, signal.SIGKILL)
    assert again.wait(29, 1, timeout=10)
    finished = later.finished(29)
    # Its supervisor saw the status, and the signals file says who sent the SIGKILL.
    assert (finished["exit_code"], finished["signal"], finished["reason"]) == (0, 9, "")
    assert _gone("sleep 6129")


@pytest.mark.parametrize("code", [0, 3])
def test_an_adopted_job_reports_its_real_exit(
    tmp_path: Path,
    launcher: Launcher,
    payload: Payload,
    launch: Launch,
    workspace: Path,
    code: int,
) -> None:
    # The fault: a restarted agent turned every adopted job's end into exit 1 ("exit
    # status is unknown"), so a success failed and released no `afterok` dependent.
    job_id = 50 + code
    wait = f"while [ ! -e go-{job_id} ]; do sleep 0.02; done"
    script = f"#!/bin/bash\necho ready\n{wait}\nexit {code}\n"
    launch(payload(job_id, script, workdir=str(workspace)))
    _wait_for_file(workspace / f"slurm-{job_id}.out")
    later = RecordingReporter()
    again = another_launcher(launcher, tmp_path, later)
    assert again.recover(poll_s=0.02) == [(job_id, 1)]
    (workspace / f"go-{job_id}").touch()
    assert again.wait(job_id, 1, timeout=10)
    finished = later.finished(job_id)
    assert (finished["exit_code"], finished["signal"], finished["reason"]) == (code, 0, "")


def test_a_restarted_agent_signals_an_adopted_job(
    tmp_path: Path,
    launcher: Launcher,
    reporter: Any,
    payload: Payload,
    launch: Launch,
    workspace: Path,
) -> None:
    script = "#!/bin/bash\ntrap 'echo got TERM; exit 0' TERM\necho ready\nsleep 60 & wait\n"
    launch(payload(34, script, workdir=str(workspace)))
    _wait_for_file(workspace / "slurm-34.out")
    again = another_launcher(launcher, tmp_path, RecordingReporter())
    assert again.recover(poll_s=0.02) == [(34, 1)]
    assert again.signal(34, 1, signal.SIGTERM)
    assert again.wait(34, 1, timeout=10)
    assert "got TERM" in (workspace / "slurm-34.out").read_text()


def test_a_job_that_ended_while_no_agent_watched_is_reported_at_start(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(30, "#!/bin/bash\nexit 7\n"))
    assert launcher.wait(30, 1, timeout=10)
    jobdir = tmp_path / "spool" / "jobs" / "30.1"
    _forget(jobdir, "exit")  # as if the agent died first
    later = RecordingReporter()
    again = another_launcher(launcher, tmp_path, later)
    assert again.recover() == []
    # Its supervisor wrote the status when it ended: the real exit is reported.
    assert later.finished(30)["exit_code"] == 7
    assert again.running() == []
    # Without it (the supervisor itself was killed), the end is unknown: a failure.
    _forget(jobdir, "exit")
    _forget(jobdir, "status")
    last = RecordingReporter()
    assert another_launcher(launcher, tmp_path, last).recover() == []
    assert last.finished(30)["exit_code"] == 1
    assert "exit status is unknown" in last.finished(30)["reason"]


def test_a_launch_the_agent_died_in_is_stopped_and_reported_failed_at_start(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    # The agent claimed the launch, started the supervisor, and died before it wrote
    # down what runs (`run`): nobody would ever report the job, whose GPUs the
    # controller holds for it.
    launch(payload(31, "#!/bin/bash\nexit 0\n"))
    assert launcher.wait(31, 1, timeout=30)
    jobdir = tmp_path / "spool" / "jobs" / "31.1"
    # Its own supervisor writes the status as it leaves: let it be gone first.
    wait_until(lambda: not supervisors_of(jobdir), timeout=30, what="the supervisor gone")
    for fact in ("exit", "run", "status", "running"):
        _forget(jobdir, fact)
    orphan = subprocess.Popen(
        ["/bin/bash", "-c", "sleep 60; true", "spurd-supervisor", str(jobdir), "", ""]
    )
    # Until it has exec'd, its command line is not yet a supervisor's to be found by.
    wait_until(lambda: orphan.pid in supervisors_of(jobdir), timeout=30, what="the orphan")
    try:
        later = RecordingReporter()
        assert another_launcher(launcher, tmp_path, later).recover() == []
        assert orphan.wait(timeout=30) == -signal.SIGKILL  # stopped, not left running
        report = later.finished(31)
        assert report["exit_code"] == 1
        assert "while launching" in report["reason"]
    finally:
        if orphan.poll() is None:
            orphan.kill()


def test_a_running_launch_the_agent_died_in_is_found_by_its_status_and_stopped(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    # The same, with the job under way: the job supervisor wrote down its sandbox's
    # monitor as it started it, and the next agent stops the whole sandbox by it.
    launch(payload(35, "#!/bin/bash\necho ready\nexec sleep 6135\n", workdir=str(workspace)))
    _wait_for_file(workspace / "slurm-35.out")
    jobdir = tmp_path / "spool" / "jobs" / "35.1"
    _forget(jobdir, "run")  # as if the agent died before it wrote it
    later = RecordingReporter()
    assert another_launcher(launcher, tmp_path, later).recover() == []
    assert _gone("sleep 6135")
    report = later.finished(35)
    assert (report["exit_code"], report["signal"]) == (1, 0)
    assert "while launching" in report["reason"]


def test_a_job_whose_supervisor_dies_dies_with_it_and_is_reported_failed(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    launch(payload(36, "#!/bin/bash\necho ready\nexec sleep 6136\n", workdir=str(workspace)))
    _wait_for_file(workspace / "slurm-36.out")
    supervisor = launcher._supervisor.pid
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    # bubblewrap's --die-with-parent: no job is left running without its lease holder.
    assert launcher.wait(36, 1, timeout=10)
    assert _gone("sleep 6136")
    report = reporter.finished(36)
    assert report["exit_code"] == 1
    assert "job supervisor died" in report["reason"]
    # The next launch starts a new one.
    launch(payload(37, "#!/bin/bash\nexit 6\n"))
    assert launcher.wait(37, 1, timeout=10)
    assert reporter.finished(37)["exit_code"] == 6


def test_a_job_cannot_reach_the_file_its_status_is_written_to(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    # The status lies in the agent's spool, which no sandbox shows: a job cannot forge
    # another's exit (nor its own, but by exiting).
    spool = launcher._jobs_dir
    script = (
        f"#!/bin/bash\nls {spool} > seen.txt 2>&1\n"
        f"echo '{{\"status\": 0}}' >> {spool}/60.1/launch.json 2>>seen.txt\nexit 5\n"
    )
    launch(payload(60, script, workdir=str(workspace)))
    assert launcher.wait(60, 1, timeout=10)
    assert reporter.finished(60)["exit_code"] == 5
    assert jobrecord.read(spool / "60.1").status == 5
    assert "60.1" not in (workspace / "seen.txt").read_text()


def test_a_job_without_an_organisation_is_refused(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(35, "#!/bin/bash\ntrue\n", tenant=""))
    assert launcher.wait(35, 1, timeout=5)
    assert "invalid organisation name" in reporter.finished(35)["reason"]


def test_the_sandbox_is_bound_to_the_allocations_cpus(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    cpu = min(os.sched_getaffinity(0))
    script = "#!/bin/bash\ngrep Cpus_allowed_list /proc/self/status\n"
    launch(payload(36, script, workdir=str(workspace), cpu_ids=[cpu]))
    assert launcher.wait(36, 1, timeout=10)
    assert (workspace / "slurm-36.out").read_text().split() == ["Cpus_allowed_list:", str(cpu)]


def test_cpu_ids_this_machine_does_not_have_leave_a_simulated_job_unbound(
    launcher: Launcher, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = "#!/bin/bash\ngrep Cpus_allowed_list /proc/self/status\n"
    launch(payload(37, script, workdir=str(workspace), cpu_ids=[100000, 100001]))
    assert launcher.wait(37, 1, timeout=10)
    assert "Cpus_allowed_list" in (workspace / "slurm-37.out").read_text()


def test_a_signal_sent_as_the_job_starts_is_not_lost(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    # Sent at once, the signal may find the sandbox still being built (its namespace
    # holds only its init): it must reach the script all the same.
    for job_id in range(40, 45):
        launch(payload(job_id, "#!/bin/bash\nsleep 60\n"))
        assert launcher.signal(job_id, 1, signal.SIGTERM)
        assert launcher.wait(job_id, 1, timeout=10)
        assert reporter.finished(job_id)["signal"] == signal.SIGTERM


# -- scontrol suspend and resume -------------------------------------------------------------

COUNTER = "#!/bin/bash\ni=0\nwhile true; do i=$((i+1)); echo $i >> counter.txt; sleep 0.1; done\n"


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _grows(path: Path, within: float = 3.0) -> bool:
    before, deadline = _lines(path), time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if _lines(path) > before:
            return True
    return False


def test_a_suspended_job_stops_and_runs_on_when_resumed(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    launch(payload(60, COUNTER, workdir=str(workspace)))
    counter = workspace / "counter.txt"
    assert _grows(counter)
    assert launcher.signal(60, 1, signal.SIGSTOP) is True
    time.sleep(0.3)  # a line being written as it stopped
    stopped_at = _lines(counter)
    time.sleep(1.0)
    assert _lines(counter) == stopped_at
    # Its supervisor does not take a stopped job for an ended one.
    assert [j["job_id"] for j in launcher.running()] == [60]
    assert not [r for r in reporter.reports if r["kind"] == "finished"]
    assert launcher.signal(60, 1, signal.SIGCONT) is True
    assert _grows(counter)
    assert launcher.signal(60, 1, signal.SIGTERM) is True
    assert launcher.wait(60, 1, timeout=10)
    # SIGSTOP and SIGCONT end nothing: the job ended of the SIGTERM it was sent.
    assert reporter.finished(60)["signal"] == signal.SIGTERM
    assert jobrecord.read(launcher._jobdir(60, 1)).signals == {signal.SIGTERM}


def test_a_suspended_job_is_cancelled_for_real(
    launcher: Launcher, reporter: Any, payload: Payload, launch: Launch, workspace: Path
) -> None:
    script = "#!/bin/bash\ntrap 'echo got TERM; exit 3' TERM\necho ready\nsleep 60 & wait\n"
    launch(payload(61, script, workdir=str(workspace)))
    _wait_for_file(workspace / "slurm-61.out")
    assert launcher.signal(61, 1, signal.SIGSTOP) is True
    time.sleep(0.2)
    assert launcher.signal(61, 1, signal.SIGTERM, kill_after_s=5) is True
    assert launcher.wait(61, 1, timeout=4)  # continued with the SIGTERM, not killed later
    assert "got TERM" in (workspace / "slurm-61.out").read_text()
    assert reporter.finished(61)["exit_code"] == 3


class FreezingLimits:
    """A cgroup's freezer, as the launcher sees it: every freeze it asked for."""

    kind = "cgroup2"

    def __init__(self) -> None:
        self.frozen: list[tuple[str, bool]] = []

    def shell(self, limits: Any) -> list[str]:
        return []

    def attach(self, name: str, pid: int, limits: Any) -> None:
        return None

    def out_of_memory(self, name: str, *, failed: bool, error_tail: Any) -> bool:
        return False

    def freeze(self, name: str, frozen: bool) -> bool:
        self.frozen.append((name, frozen))
        return True

    def release(self, name: str) -> None:
        return None


def test_a_job_with_a_cgroup_is_frozen_not_signalled(
    payload: Payload, identities: Any, make_launcher: Callable[..., Launcher]
) -> None:
    limits = FreezingLimits()
    launcher = make_launcher(limits=limits)
    try:
        workspace = launcher.workspaces.ensure(
            "acme", identities.for_job(tenant="acme", user="alice")
        )
        launcher.launch(LaunchRequest.from_payload(payload(62, COUNTER, workdir=str(workspace))))
        counter = workspace / "counter.txt"
        assert _grows(counter)
        assert launcher.signal(62, 1, signal.SIGSTOP) is True
        assert launcher.signal(62, 1, signal.SIGCONT) is True
        assert limits.frozen == [("62.1", True), ("62.1", False)]
        assert _grows(counter)  # no SIGSTOP reached it: the (stand-in) cgroup did the work
        launcher.signal(62, 1, signal.SIGTERM)
        assert limits.frozen[-1] == ("62.1", False)  # thawed to act on the SIGTERM
        assert launcher.wait(62, 1, timeout=10)
    finally:
        launcher.kill_all(timeout=5)
