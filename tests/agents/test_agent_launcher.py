"""The launcher runs real processes: bash scripts that write, sleep, fail and get killed."""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents.launcher import InvalidLaunch, Launcher, LaunchRequest

Payload = Callable[..., dict[str, Any]]
Launch = Callable[[dict[str, Any]], bool]


def _gone(pid: int, timeout: float = 5.0) -> bool:
    """Dead or a zombie (pid 1 of a container may never reap orphans)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def _wait_for_file(path: Path, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def test_a_script_runs_in_its_workdir_and_writes_the_default_output_file(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    script = "#!/bin/bash\necho hello from $SLURM_JOB_ID in $(pwd)\necho oops >&2\n"
    assert launch(payload(7, script, workdir=str(tmp_path))) is False
    assert launcher.wait(7, 1, timeout=10)
    out = (tmp_path / "slurm-7.out").read_text()
    assert f"hello from 7 in {tmp_path}" in out
    assert "oops" in out  # no --error: stderr goes to the same file
    kinds = [r["kind"] for r in reporter.reports]
    assert kinds == ["started", "finished"]
    assert reporter.reports[0]["pid"] > 0
    assert reporter.finished(7) | {"reason": ""} == {
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
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    script = "#!/bin/bash\nenv > env.txt\n"
    p = payload(8, script, workdir=str(tmp_path), gpus=[2, 3], environment={"MY_VAR": "x y"})
    launch(p)
    assert launcher.wait(8, 1, timeout=10)
    env = dict(
        line.split("=", 1)
        for line in (tmp_path / "env.txt").read_text().splitlines()
        if "=" in line
    )
    assert env["MY_VAR"] == "x y"
    assert env["SLURM_JOB_ID"] == "8"
    assert env["SLURM_CLUSTER_NAME"] == "testcluster"
    assert env["SLURMD_NODENAME"] == "sim01"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["SLURM_JOB_GPUS"] == "2,3"
    assert env["SLURM_JOB_UID"] == str(os.getuid())
    assert "PATH" in env


def test_stdin_is_empty_and_stderr_can_go_to_its_own_file(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    script = "#!/bin/bash\ncat\necho out\necho err >&2\n"
    p = payload(9, script, workdir=str(tmp_path), stdout="o-%j.txt", stderr="e-%j.txt")
    launch(p)
    assert launcher.wait(9, 1, timeout=10)
    assert (tmp_path / "o-9.txt").read_text() == "out\n"
    assert (tmp_path / "e-9.txt").read_text() == "err\n"


def test_output_is_appended_like_slurms_default_open_mode(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    (tmp_path / "slurm-10.out").write_text("before\n")
    launch(payload(10, "#!/bin/bash\necho after\n", workdir=str(tmp_path)))
    assert launcher.wait(10, 1, timeout=10)
    assert (tmp_path / "slurm-10.out").read_text() == "before\nafter\n"


def test_the_exit_code_is_reported(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(11, "#!/bin/bash\nexit 3\n", workdir=str(tmp_path)))
    assert launcher.wait(11, 1, timeout=10)
    assert (reporter.finished(11)["exit_code"], reporter.finished(11)["signal"]) == (3, 0)


def test_the_script_is_kept_in_the_spool_with_mode_0700(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    launch(payload(12, "#!/bin/bash\ntrue\n", workdir=str(tmp_path)))
    assert launcher.wait(12, 1, timeout=10)
    script = tmp_path / "spool" / "jobs" / "12.1" / "script"
    assert script.read_text() == "#!/bin/bash\ntrue\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o700


def test_a_second_launch_of_the_same_attempt_is_a_duplicate_and_runs_nothing(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    p = payload(13, "#!/bin/bash\necho run >> runs.txt\n", workdir=str(tmp_path))
    assert launch(p) is False
    assert launch(p) is True
    assert launcher.wait(13, 1, timeout=10)
    assert (tmp_path / "runs.txt").read_text() == "run\n"
    assert [r["kind"] for r in reporter.reports] == ["started", "finished"]


def test_a_restarted_agent_does_not_run_an_attempt_its_predecessor_ran(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    p = payload(14, "#!/bin/bash\necho run >> runs.txt\n", workdir=str(tmp_path))
    launch(p)
    assert launcher.wait(14, 1, timeout=10)
    again = Launcher(node="sim01", spool_dir=tmp_path / "spool", reporter=reporter)
    assert again.launch(LaunchRequest.from_payload(p)) is True
    time.sleep(0.2)
    assert (tmp_path / "runs.txt").read_text() == "run\n"


def test_a_different_job_reusing_an_id_moves_the_old_directory_aside(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    p = payload(15, "#!/bin/bash\necho run >> runs.txt\n", workdir=str(tmp_path))
    launch(p)
    assert launcher.wait(15, 1, timeout=10)
    again = Launcher(node="sim01", spool_dir=tmp_path / "spool", reporter=reporter)
    p["job"]["submit_time"] += 1000  # the controller's state was wiped: a new job 15
    assert again.launch(LaunchRequest.from_payload(p)) is False
    assert again.wait(15, 1, timeout=10)
    assert (tmp_path / "runs.txt").read_text() == "run\nrun\n"


def test_a_new_attempt_runs_again(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    script = "#!/bin/bash\necho $SLURM_RESTART_COUNT >> runs.txt\n"
    launch(payload(16, script, workdir=str(tmp_path), attempt=1))
    assert launcher.wait(16, 1, timeout=10)
    launch(payload(16, script, workdir=str(tmp_path), attempt=2))
    assert launcher.wait(16, 2, timeout=10)
    assert (tmp_path / "runs.txt").read_text() == "0\n1\n"


def test_only_the_first_node_runs_the_batch_script(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    p = payload(17, "#!/bin/bash\necho ran\n", workdir=str(tmp_path), nodes=["sim00", "sim01"])
    assert launch(p) is False
    assert launch(p) is True
    time.sleep(0.2)
    assert not (tmp_path / "slurm-17.out").exists()
    assert reporter.reports == []
    assert launcher.running() == []


def test_a_job_whose_workdir_is_missing_runs_in_its_own_directory(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    missing = "/nonexistent/home/alice/work"
    launch(payload(18, "#!/bin/bash\npwd\necho $SLURM_SUBMIT_DIR\n", workdir=missing))
    assert launcher.wait(18, 1, timeout=10)
    work = tmp_path / "spool" / "jobs" / "18.1" / "work"
    assert (work / "slurm-18.out").read_text() == f"{work}\n{missing}\n"


def test_an_unwritable_output_path_fails_the_launch_with_exit_code_1(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    p = payload(19, "#!/bin/bash\necho x\n", workdir=str(tmp_path), stdout="/nonexistent/dir/out")
    assert launch(p) is False
    assert launcher.wait(19, 1, timeout=5)
    finished = reporter.finished(19)
    assert (finished["exit_code"], finished["signal"]) == (1, 0)
    assert "/nonexistent/dir/out" in finished["reason"]
    assert [r["kind"] for r in reporter.reports] == ["finished"]
    error = tmp_path / "spool" / "jobs" / "19.1" / "launch-error"
    assert "cannot open /nonexistent/dir/out" in error.read_text()


def test_a_workdir_that_is_a_file_fails_the_launch_and_says_so_in_the_output(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    (tmp_path / "afile").write_text("")
    out = tmp_path / "out.txt"
    launch(payload(20, "#!/bin/bash\necho x\n", workdir=str(tmp_path / "afile"), stdout=str(out)))
    assert launcher.wait(20, 1, timeout=5)
    assert reporter.finished(20)["exit_code"] == 1
    assert "not a directory" in reporter.finished(20)["reason"]


def test_a_script_that_cannot_be_executed_fails_the_launch(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(21, "#!/nonexistent/interpreter\necho x\n", workdir=str(tmp_path)))
    assert launcher.wait(21, 1, timeout=5)
    assert reporter.finished(21)["exit_code"] == 1
    assert "cannot execute the batch script" in (tmp_path / "slurm-21.out").read_text()


def test_a_signal_reaches_every_process_of_the_job(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    script = "#!/bin/bash\nsleep 60 &\necho $! > child.pid\nwait\n"
    launch(payload(22, script, workdir=str(tmp_path)))
    child = int(_wait_for_file(tmp_path / "child.pid"))
    assert launcher.running()[0]["job_id"] == 22
    assert launcher.signal(22, 1, signal.SIGTERM) is True
    assert launcher.wait(22, 1, timeout=10)
    finished = reporter.finished(22)
    assert (finished["exit_code"], finished["signal"]) == (0, signal.SIGTERM)
    assert _gone(child)
    assert launcher.running() == []


def test_a_job_that_ignores_sigterm_is_killed_after_kill_after_s(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    script = "#!/bin/bash\ntrap 'echo got TERM' TERM\necho ready\nwhile true; do sleep 0.05; done\n"
    launch(payload(23, script, workdir=str(tmp_path)))
    _wait_for_file(tmp_path / "slurm-23.out")
    started = time.monotonic()
    assert launcher.signal(23, 1, signal.SIGTERM, kill_after_s=0.5) is True
    assert launcher.wait(23, 1, timeout=10)
    assert time.monotonic() - started >= 0.45
    assert reporter.finished(23)["signal"] == signal.SIGKILL
    assert "got TERM" in (tmp_path / "slurm-23.out").read_text()


def test_a_stopped_job_still_ends_on_sigterm(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(24, "#!/bin/bash\necho ready\nsleep 60\n", workdir=str(tmp_path)))
    _wait_for_file(tmp_path / "slurm-24.out")
    assert launcher.signal(24, 1, signal.SIGSTOP)
    assert launcher.signal(24, 1, signal.SIGTERM)
    assert launcher.wait(24, 1, timeout=10)
    assert reporter.finished(24)["signal"] == signal.SIGTERM


def test_processes_left_behind_by_the_script_are_killed_when_it_ends(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    script = "#!/bin/bash\nsleep 60 &\necho $! > child.pid\n"
    launch(payload(25, script, workdir=str(tmp_path)))
    assert launcher.wait(25, 1, timeout=10)
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_signalling_an_unknown_or_finished_job_delivers_nothing(
    tmp_path: Path, launcher: Launcher, payload: Payload, launch: Launch
) -> None:
    assert launcher.signal(99, 1, signal.SIGTERM) is False
    launch(payload(26, "#!/bin/bash\ntrue\n", workdir=str(tmp_path)))
    assert launcher.wait(26, 1, timeout=10)
    assert launcher.signal(26, 1, signal.SIGTERM) is False


def test_a_launch_for_another_node_is_refused(
    tmp_path: Path, launcher: Launcher, payload: Payload
) -> None:
    p = payload(27, "#!/bin/bash\n", workdir=str(tmp_path), node="sim02")
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
    tmp_path: Path, payload: Payload, mutate: Callable[[dict[str, Any]], Any], message: str
) -> None:
    p = payload(28, "#!/bin/bash\n", workdir=str(tmp_path))
    mutate(p)
    with pytest.raises(InvalidLaunch, match=message):
        LaunchRequest.from_payload(p)


def test_a_restarted_agent_adopts_a_job_that_still_runs_and_reports_its_end(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(29, "#!/bin/bash\necho ready\nsleep 60\n", workdir=str(tmp_path)))
    _wait_for_file(tmp_path / "slurm-29.out")
    pid = launcher.running()[0]["pid"]
    # A new agent on the same spool; the old one is gone without a word.
    later = type(reporter)()
    again = Launcher(node="sim01", spool_dir=tmp_path / "spool", reporter=later)
    assert again.recover(poll_s=0.02) == [(29, 1)]
    assert again.running() == [{"job_id": 29, "attempt": 1, "pid": pid}]
    assert again.launch(LaunchRequest.from_payload(payload(29, "x", workdir="/"))) is True
    assert again.signal(29, 1, signal.SIGKILL)
    assert again.wait(29, 1, timeout=10)
    finished = later.finished(29)
    assert finished["exit_code"] == 1
    assert "exit status is unknown" in finished["reason"]


def test_a_job_that_ended_while_no_agent_watched_is_reported_at_start(
    tmp_path: Path, launcher: Launcher, reporter: Any, payload: Payload, launch: Launch
) -> None:
    launch(payload(30, "#!/bin/bash\ntrue\n", workdir=str(tmp_path)))
    assert launcher.wait(30, 1, timeout=10)
    (tmp_path / "spool" / "jobs" / "30.1" / "exit").unlink()  # as if the agent died first
    later = type(reporter)()
    again = Launcher(node="sim01", spool_dir=tmp_path / "spool", reporter=later)
    assert again.recover() == []
    assert later.finished(30)["exit_code"] == 1
    assert again.running() == []
