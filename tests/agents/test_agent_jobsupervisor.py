"""The node's job supervisor (agents/jobsupervisor.py), through the agent's handle on it
(agents/supervisor.py, `JobSupervisor`): a real process that starts real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import jobrecord
from agents import supervisor as supervisor_module
from agents.identity import Identities
from agents.supervisor import JobSupervisor
from tests.fixtures.processes import wait_until

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[JobSupervisor]:
    handle = JobSupervisor(tmp_path / "supervisor", lambda: None)
    yield handle
    handle.close()


def _jobdir(tmp_path: Path, name: str = "7.1") -> Path:
    """A job's spool directory as the agent makes it: its launch written down."""
    jobdir = tmp_path / "jobs" / name
    jobdir.mkdir(parents=True)
    (jobdir / "launch.json").write_text('{"job_id": 7}\n')
    return jobdir


def _read(fd: int) -> str:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data.decode()


def test_each_descriptor_lands_at_its_number_and_nothing_else_is_open(
    supervisor: JobSupervisor, tmp_path: Path
) -> None:
    # Numbers that the supervisor's own descriptors are likely to hold (its socket, the
    # lease FIFO, /dev/null): once, /dev/null took a job's info pipe and stdin the job's.
    pipes = [os.pipe() for _ in range(5)]
    out_r, out_w = pipes[0]
    fds = {3: pipes[1][1], 4: pipes[2][1], 5: pipes[3][1], 6: pipes[4][1], 1: out_w, 2: out_w}
    script = (
        "for fd in 3 4 5 6; do echo $fd >&$fd; done; readlink /proc/self/fd/0; "
        "ls /proc/self/fd | tr '\\n' ' '"
    )
    job = supervisor.spawn(
        directory=_jobdir(tmp_path), argv=["/bin/sh", "-c", script], identity=None, fds=fds
    )
    for _, w in pipes:
        os.close(w)
    assert job.wait(10) == 0
    assert [_read(r).strip() for r, _ in pipes[1:]] == ["3", "4", "5", "6"]
    stdin, listing = _read(out_r).strip().split("\n")
    assert stdin == "/dev/null"
    # ls's own descriptor on the directory it lists comes on top.
    assert set(listing.split()) - {"0", "1", "2", "3", "4", "5", "6"} <= {"7"}


@pytest.mark.skipif(not AS_ROOT, reason="only root gives a job another identity")
def test_a_job_runs_as_the_identity_it_was_given_and_cannot_gain_privileges(
    supervisor: JobSupervisor, tmp_path: Path
) -> None:
    identity = Identities().for_job(tenant="acme", user="alice")
    out_r, out_w = os.pipe()
    job = supervisor.spawn(
        directory=_jobdir(tmp_path),
        argv=["/bin/sh", "-c", "id -u; id -g; id -G; grep -E '^(NoNewPrivs|CapInh|CapAmb)'"
              " /proc/self/status"],
        identity=(identity.uid, identity.gid, [44]),
        fds={1: out_w, 2: out_w},
    )  # fmt: skip
    os.close(out_w)
    assert job.wait(10) == 0
    lines = _read(out_r).split("\n")
    assert lines[:3] == [str(identity.uid), str(identity.gid), f"{identity.gid} 44"]
    status = dict(line.split(":\t") for line in lines[3:] if line)
    assert status == {"NoNewPrivs": "1", "CapInh": "0" * 16, "CapAmb": "0" * 16}


def test_the_status_is_recorded_as_a_shell_reads_it(
    supervisor: JobSupervisor, tmp_path: Path
) -> None:
    exited, killed = _jobdir(tmp_path, "1.1"), _jobdir(tmp_path, "2.1")
    first = supervisor.spawn(
        directory=exited, argv=["/bin/sh", "-c", "exit 3"], identity=None, fds={}
    )
    second = supervisor.spawn(
        directory=killed, argv=["/bin/sh", "-c", "kill -TERM $$"], identity=None, fds={}
    )
    assert (first.wait(10), second.wait(10)) == (3, 128 + signal.SIGTERM)
    assert (jobrecord.read(exited).status, jobrecord.read(killed).status) == (3, 143)


def test_while_a_job_runs_its_status_names_its_process(
    supervisor: JobSupervisor, tmp_path: Path
) -> None:
    jobdir = _jobdir(tmp_path)
    job = supervisor.spawn(
        directory=jobdir, argv=["/bin/sh", "-c", "exec sleep 30"], identity=None, fds={}
    )
    try:
        assert jobrecord.read(jobdir).status is None
        assert jobrecord.read(jobdir).running == (job.pid, job.start)
    finally:
        os.kill(job.pid, signal.SIGKILL)
    assert job.wait(10) == 128 + signal.SIGKILL
    assert jobrecord.read(jobdir).running is None


def test_a_job_outlives_the_agent_that_let_its_supervisor_go(tmp_path: Path) -> None:
    handle = JobSupervisor(tmp_path / "supervisor", lambda: None)
    jobdir, go = _jobdir(tmp_path), tmp_path / "go"
    wait = f"while [ ! -e {go} ]; do sleep 0.02; done; exit 4"
    job = handle.spawn(directory=jobdir, argv=["/bin/sh", "-c", wait], identity=None, fds={})
    supervisor_pid = handle.pid
    assert supervisor_pid is not None
    handle.close()  # the agent is gone
    time.sleep(0.2)
    assert os.path.exists(f"/proc/{job.pid}")
    go.touch()
    # Its supervisor records its end for the next agent, then leaves: nothing to keep.
    wait_until(lambda: jobrecord.read(jobdir).status == 4, timeout=10, what="the status")
    wait_until(lambda: not Path(f"/proc/{supervisor_pid}").exists(), timeout=10, what="exit")
    assert list((tmp_path / "supervisor").iterdir()) == []  # its lease FIFO with it


def test_a_job_whose_lease_runs_out_is_killed_and_marked_fenced(tmp_path: Path) -> None:
    handle = JobSupervisor(tmp_path / "supervisor", lambda: 0.5)
    try:
        jobdir = _jobdir(tmp_path)
        job = handle.spawn(
            directory=jobdir, argv=["/bin/sh", "-c", "exec sleep 30"], identity=None, fds={}
        )
        begun = time.monotonic()
        assert job.wait(10) == 128 + signal.SIGKILL
        assert job.fenced and (jobdir / "fenced").exists()
        assert time.monotonic() - begun < 3
        # No lease, no job.
        with pytest.raises(OSError, match="holds no lease"):
            handle.spawn(directory=_jobdir(tmp_path, "8.1"), argv=["/bin/true"], identity=None,
                         fds={})  # fmt: skip
        # A renewal (the next acknowledged heartbeat) lets jobs start again.
        handle.renew(5.0)
        time.sleep(0.1)
        again = handle.spawn(
            directory=_jobdir(tmp_path, "99.1"), argv=["/bin/true"], identity=None, fds={}
        )
        assert again.wait(10) == 0
    finally:
        handle.close()


def test_renewals_from_any_agent_keep_the_jobs_running(tmp_path: Path) -> None:
    handle = JobSupervisor(tmp_path / "supervisor", lambda: 0.4)
    # An agent started later renews through the same spool directory.
    later = JobSupervisor(tmp_path / "supervisor", lambda: 0.4)
    stop = threading.Event()

    def heartbeats() -> None:
        while not stop.wait(0.1):
            later.renew(0.4)

    thread = threading.Thread(target=heartbeats, daemon=True)
    thread.start()
    try:
        job = handle.spawn(
            directory=_jobdir(tmp_path), argv=["/bin/sh", "-c", "sleep 1.5; exit 2"],
            identity=None, fds={},
        )  # fmt: skip
        assert job.wait(10) == 2
        assert not job.fenced
    finally:
        stop.set()
        handle.close()


def test_a_command_that_cannot_start_is_refused_with_why(
    supervisor: JobSupervisor, tmp_path: Path
) -> None:
    with pytest.raises(OSError, match="/nonexistent/bwrap"):
        supervisor.spawn(
            directory=_jobdir(tmp_path), argv=["/nonexistent/bwrap"], identity=None, fds={}
        )
    # The supervisor goes on: the next job starts.
    job = supervisor.spawn(
        directory=_jobdir(tmp_path, "8.1"), argv=["/bin/true"], identity=None, fds={}
    )
    assert job.wait(10) == 0


def test_a_descriptor_number_outside_the_jobs_range_is_refused(
    supervisor: JobSupervisor, tmp_path: Path
) -> None:
    _, w = os.pipe()
    try:
        with pytest.raises(OSError, match="descriptor number 200"):
            supervisor.spawn(
                directory=_jobdir(tmp_path), argv=["/bin/true"], identity=None, fds={200: w}
            )
    finally:
        os.close(w)


def _mount_points(mountinfo: str) -> list[str]:
    return [line.split()[4] for line in mountinfo.splitlines() if line]


@pytest.mark.skipif(not AS_ROOT, reason="only root gives it a mount namespace of its own")
def test_its_jobs_see_no_mount_under_dev_proc_or_sys_and_the_host_keeps_them(
    supervisor: JobSupervisor, tmp_path: Path
) -> None:
    """Bubblewrap rereads the whole mount table at each bind it makes: the job supervisor's
    namespace drops what no sandbox binds from (agents/jobsupervisor.py docstring)."""
    host_before = _mount_points(Path("/proc/self/mountinfo").read_text())
    out_r, out_w = os.pipe()
    job = supervisor.spawn(
        directory=_jobdir(tmp_path), argv=["/bin/cat", "/proc/self/mountinfo"],
        identity=None, fds={1: out_w},
    )  # fmt: skip
    os.close(out_w)
    seen = _mount_points(_read(out_r))
    assert job.wait(10) == 0
    assert {"/", "/dev", "/proc", "/sys"} <= set(seen)
    assert not [p for p in seen if p.startswith(("/dev/", "/proc/", "/sys/"))]
    # The host's table is as it was (the agent's namespace is not the supervisor's).
    assert _mount_points(Path("/proc/self/mountinfo").read_text()) == host_before
    assert len(seen) <= len(host_before)


@pytest.mark.skipif(not AS_ROOT, reason="only root makes a mount namespace")
def test_mounts_are_left_alone_in_the_namespace_of_its_parent() -> None:
    """Pruning runs only in a namespace of its own: started in its parent's (an agent
    that could not give it one), it changes nothing. Both runs are in throwaway
    namespaces, so that a failure cannot detach the host's mounts."""
    root = str(Path(__file__).resolve().parents[2])
    prune = (
        f"import sys; sys.path.insert(0, {root!r}); "
        "from agents.jobsupervisor import _prune_mounts; _prune_mounts(); "
        "print(len(open('/proc/self/mountinfo').readlines()))"
    )
    python = [sys.executable, "-I", "-S", "-c", prune]
    unshare = ["unshare", "--mount", "--propagation", "slave"]

    def lines(argv: list[str]) -> int:
        return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    everything = len(Path("/proc/self/mountinfo").read_text().splitlines())
    # Its parent (the shell) is in the same new namespace: nothing is detached.
    shared = lines([*unshare, "/bin/sh", "-c", '"$@"; true', "sh", *python])
    # Its parent (this test) is not: what lies under /dev, /proc and /sys goes.
    own = lines([*unshare, *python])
    under = [p for p in _mount_points(Path("/proc/self/mountinfo").read_text())
             if p.startswith(("/dev/", "/proc/", "/sys/"))]  # fmt: skip
    assert shared == everything
    assert own == everything - len(under)


def test_mount_points_are_read_as_the_kernel_escapes_them() -> None:
    from agents.jobsupervisor import _unescape

    assert _unescape(rb"/a\040b\011c\134d\012e") == b"/a b\tc\\d\ne"
    assert _unescape(b"/plain") == b"/plain"


def test_where_no_mount_namespace_can_be_made_it_starts_in_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's root often may not unshare: the supervisor starts all the same (in
    the agent's namespace, which it then leaves as it is)."""
    monkeypatch.setattr(supervisor_module, "UNSHARE", "/bin/false")
    handle = JobSupervisor(tmp_path / "supervisor", lambda: None)
    try:
        job = handle.spawn(directory=_jobdir(tmp_path), argv=["/bin/true"], identity=None, fds={})
        assert job.wait(10) == 0
        pid = handle.pid
        assert pid is not None
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"prune" not in argv
        assert os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    finally:
        handle.close()
