"""Fencing by lease, held by each job's supervisor (agents/supervisor.py): a job whose
lease is not renewed dies, whatever the agent's main process is doing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from agents.jobend import FENCED
from agents.launcher import Launcher, LaunchError, LaunchRequest
from agents.supervisor import Lease
from tests.agents.conftest import RecordingReporter, make_payload
from tests.fixtures.platform import processes_gone


@pytest.fixture
def lease() -> Lease:
    return Lease()


@pytest.fixture
def fenced_launcher(make_launcher: Callable[..., Launcher], lease: Lease) -> Launcher:
    return make_launcher(lease=lease)


def _launch(launcher: Launcher, job_id: int, script: str) -> None:
    launcher.launch(LaunchRequest.from_payload(make_payload(job_id, script)))


def _started(reporter: RecordingReporter, job_id: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["kind"] == "started" and r["job_id"] == job_id for r in reporter.reports):
            return
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} never started")


def test_without_a_lease_a_node_starts_nothing(fenced_launcher: Launcher) -> None:
    with pytest.raises(LaunchError, match="holds no lease"):
        _launch(fenced_launcher, 70, "#!/bin/bash\ntrue\n")
    assert fenced_launcher.running() == []


def test_a_job_whose_lease_runs_out_is_killed_by_its_supervisor(
    fenced_launcher: Launcher, reporter: RecordingReporter, lease: Lease
) -> None:
    lease.renew(sent_at=time.monotonic(), lease_s=1.0)
    _launch(fenced_launcher, 71, "#!/bin/bash\nexec sleep 7171\n")
    _started(reporter, 71)
    begun = time.monotonic()
    assert fenced_launcher.wait(71, 1, timeout=10)
    assert time.monotonic() - begun < 3.0
    finished = reporter.finished(71)
    assert (finished["exit_code"], finished["signal"], finished["reason"]) == (0, 9, FENCED)
    assert processes_gone("sleep 7171", 5)


def test_a_renewed_lease_keeps_the_job_running(
    fenced_launcher: Launcher, reporter: RecordingReporter, lease: Lease
) -> None:
    lease.renew(sent_at=time.monotonic(), lease_s=0.6)
    _launch(fenced_launcher, 72, "#!/bin/bash\nsleep 2\nexit 4\n")
    _started(reporter, 72)
    # Heartbeats every 0.2 s, each acknowledged: the job outlives its first lease by far.
    renewals = _renew_every(fenced_launcher, lease, 0.2, lease_s=0.6)
    try:
        assert fenced_launcher.wait(72, 1, timeout=10)
    finally:
        renewals()
    finished = reporter.finished(72)
    assert (finished["exit_code"], finished["signal"], finished["reason"]) == (4, 0, "")


def _renew_every(
    launcher: Launcher, lease: Lease, every_s: float, *, lease_s: float
) -> Callable[[], Any]:
    import threading

    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            lease.renew(sent_at=time.monotonic(), lease_s=lease_s)
            launcher.renew_lease()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return stop.set
