"""`squeue --start` and `scontrol show job` end to end: the commands' own `run`, their
ApiClient speaking HTTP to the real web app (pytest-django's live server), which asks a
real `spurctld` whose leader estimates when the waiting jobs start."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from scheduler.cli import scontrol, squeue
from scheduler.slurm.timefmt import format_epoch
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.test_admin_commands import _submit, cli

__all__ = ["cli"]  # the fixture, shared with the other commands' tests


def test_squeue_start_shows_when_a_job_waiting_for_resources_is_expected_to_start(
    cli: Callable[..., tuple[int, str, str]], acme: Tenant, capsys: pytest.CaptureFixture[str]
) -> None:
    # The one GPU is busy for ten minutes; the next job waits for it, a held one waits.
    busy = _submit(cli, acme, name="busy", gpus_per_node=1, time_limit_min=10)
    waiting = _submit(cli, acme, name="next", gpus_per_node=1, time_limit_min=5)
    held = _submit(cli, acme, name="held", gpus_per_node=1, hold=True)
    deadline = time.monotonic() + 30  # the leader estimates every few seconds
    while True:
        rc, out, err = cli(squeue, "--start", capsys=capsys)
        assert (rc, err) == (0, "")
        if "N/A" not in out.splitlines()[1]:
            break
        assert time.monotonic() < deadline, f"no start estimate came:\n{out}"
        time.sleep(0.2)
    rc, started, _ = cli(squeue, "-h", "-j", str(busy), "-o", "%S", capsys=capsys)
    begins = time.mktime(time.strptime(started.strip(), "%Y-%m-%dT%H:%M:%S"))
    expected = format_epoch(begins + 600)  # when the one ahead of it runs out
    assert out.splitlines() == [
        "             JOBID PARTITION     NAME     USER ST          START_TIME  NODES "
        "SCHEDNODES           NODELIST(REASON)",
        f"{waiting:>18} {'gpu':>9} {'next':>8} {'max':>8} PD {expected:>19} {1:>6} "
        f"{'node01':<20} (Resources)",
        f"{held:>18} {'gpu':>9} {'held':>8} {'max':>8} PD {'N/A':>19} {1:>6} "
        f"{'(null)':<20} (JobHeldUser)",
    ]
    rc, out, _ = cli(scontrol, "show", "job", str(waiting), capsys=capsys)
    lines = out.splitlines()
    ends = format_epoch(begins + 600 + 300)
    assert f"   StartTime={expected} EndTime={ends} Deadline=N/A" in lines
    assert "   NodeList= SchedNodeList=node01" in lines
