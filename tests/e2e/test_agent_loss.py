"""An agent that vanishes mid-job (frozen: no heartbeats, no answers): its node goes
down, its job ends NODE_FAIL (or is requeued and runs elsewhere), nothing else is lost."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from agents import jobrecord
from tests.e2e.test_platform import submit, wait_for_state
from tests.fixtures.platform import Platform, start_platform

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Platform:
    yield from start_platform(
        tmp_path_factory.mktemp("agentloss"), nodes="sim01=h100-8,sim02=h100-8", node_timeout_s=3
    )


def agent_pid(platform: Platform, node: str) -> int:
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if (
            any(a.endswith("spurd") for a in args)
            and node in args
            and any(str(platform.state_dir) in a for a in args)
        ):
            return int(proc.name)
    raise AssertionError(f"no agent for {node}")


def sandbox_inits(platform: Platform, node: str) -> list[int]:
    """The pid namespace inits of the jobs an agent started (its spool's job records): a
    SIGKILL to one ends all of its job."""
    pids = []
    for jobdir in (platform.state_dir / "agents" / node / "jobs").glob("*.*"):
        run = jobrecord.read(jobdir, launch=False).run
        if run is not None:
            pids.append(int(run["processes"].split()[0]))
    return pids


def test_a_vanished_agent_fails_its_job_and_requeues_the_requeueable(platform):
    here = platform.workspace_dir("agentloss")
    # First fit puts both 4-GPU jobs on the first node.
    plain = submit(
        platform, "--gres=gpu:4", "--wrap", "echo $$ > plain.pid; exec sleep 300", cwd=here
    )
    again = submit(
        platform,
        "--gres=gpu:4",
        "--requeue",
        "-o",
        "again-%j.out",
        "--wrap",
        "echo $$ >> again.pid; hostname; sleep 4",
        cwd=here,
    )
    deadline = time.monotonic() + 30
    while not ((here / "plain.pid").exists() and (here / "again.pid").exists()):
        assert time.monotonic() < deadline, "the jobs never started"
        time.sleep(0.1)
    out = platform.cli("squeue", "-h", "-o", "%i %N").stdout.split("\n")
    nodes = {int(r.split()[0]): r.split()[1] for r in out if r}
    assert nodes[plain] == nodes[again] == "sim01"
    orphans = sandbox_inits(platform, "sim01")
    agent = agent_pid(platform, "sim01")
    try:
        # Frozen, the agent is gone to the cluster (no heartbeat, no answer) while the
        # supervisor, which would stop the platform for a dead child, sees it alive.
        os.kill(agent, signal.SIGSTOP)

        assert wait_for_state(platform, plain, "NODE_FAIL", timeout=30) == "0:0"
        info = platform.cli("sinfo", "-N", "-h", "-o", "%N %t").stdout.split("\n")
        assert "sim01 down" in info
        # The requeueable job runs again, on the node that is left, and completes.
        assert wait_for_state(platform, again, "COMPLETED", timeout=60) == "0:0"
        runs = here.joinpath("again.pid").read_text().split()
        assert len(runs) == 2
        later = submit(platform, "--gres=gpu:1", "--wrap", "true", cwd=here)
        assert wait_for_state(platform, later, "COMPLETED", timeout=60) == "0:0"
    finally:
        # Nobody is left on sim01 to kill what it started.
        os.kill(agent, signal.SIGCONT)
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
