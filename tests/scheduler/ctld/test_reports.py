"""Durable, idempotent reports and heartbeat reconciliation, with a real controller (and
a real agent, spurd, where the agent is the point): a `finished` report lost with its
agent is resent from the spool, a job that vanished without one ends NODE_FAIL, and a
restarted agent reports an adopted job's real exit."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import jobrecord
from agents.reports import outbox_reports
from scheduler.client import ControllerClient, JobReport
from tests.agents.spurd import Courier, RunningAgent, reachable_dir, start_agent
from tests.fixtures.controller import RunningController, write_controller_config
from tests.fixtures.processes import Processes, free_port, wait_until
from tests.scheduler.core.factories import gpu_node, spec

TOKEN = "reports-test-token"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
def work_root() -> Iterator[Path]:
    path = reachable_dir()
    yield path / "work"
    shutil.rmtree(path, ignore_errors=True)


def make_controller(tmp_path: Path, procs: Processes, node_timeout_s: float) -> RunningController:
    config = tmp_path / "spur.toml"
    port = free_port()
    write_controller_config(
        config,
        token=TOKEN,
        http_port=port,
        raft_port=free_port(),
        state_dir=tmp_path / "ctld",
        broker_url="filesystem://",
        broker_folder=tmp_path / "broker",
        node_timeout_s=node_timeout_s,
    )
    running = RunningController(f"http://127.0.0.1:{port}", TOKEN, config, tmp_path / "ctld", procs)
    running.start()
    return running


def settle(client: ControllerClient, job_id: int, state: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            job = client.job(job_id)
            if job["state"] == state:
                return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never {state}: {client.job(job_id)}")


def run_job(
    client: ControllerClient, courier: Courier, agent: RunningAgent, script: str
) -> tuple[int, Path]:
    """Submit and launch a job on the agent; its id and its spool directory."""
    job_id = client.submit(spec(script=script).to_dict())["job_id"]
    courier.deliver(job_id)
    wait_until(lambda: client.job(job_id)["pid"] is not None, timeout=30, what="started")
    return job_id, agent.spool / "jobs" / f"{job_id}.1"


def test_a_finished_report_lost_with_its_agent_is_resent_from_the_spool(
    tmp_path: Path, procs: Processes, work_root: Path
) -> None:
    # The fault: the report queue was memory. The job ended while the controller was
    # away; the agent stopped before it could deliver `finished`; the one that started
    # next skipped the job (its `exit` file said it was done): RUNNING for ever.
    controller = make_controller(tmp_path, procs, node_timeout_s=30)
    agent = start_agent(
        tmp_path, procs, name="sim01", token=TOKEN, controllers=[controller.url],
        work_root=work_root,
    )  # fmt: skip
    courier = Courier(tmp_path / "broker", TOKEN)
    go = work_root / "acme" / "go"
    script = f"#!/bin/bash\nwhile [ ! -e {go} ]; do sleep 0.05; done\nexit 0\n"
    with controller.client() as client:
        job_id, jobdir = run_job(client, courier, agent, script)
    controller.stop()
    go.touch()
    wait_until(
        lambda: jobrecord.read(jobdir).exit is not None, timeout=30, what="the agent to see the end"
    )
    agent.stop()
    assert [r.kind for r in outbox_reports(agent.spool / "outbox")] == ["finished"]
    controller.start()
    agent.start()
    with controller.client() as client:
        job = settle(client, job_id, "COMPLETED")
    assert (job["exit_code"], job["signal"]) == (0, 0)
    wait_until(lambda: not outbox_reports(agent.spool / "outbox"), what="acknowledged")


def test_a_restarted_agent_reports_an_adopted_jobs_real_exit(
    tmp_path: Path, procs: Processes, work_root: Path
) -> None:
    # The fault: a job adopted by a restarted agent ended "exit 1, exit status is
    # unknown", a success turned into a failure (and its `afterok` dependents never ran).
    controller = make_controller(tmp_path, procs, node_timeout_s=30)
    agent = start_agent(
        tmp_path, procs, name="sim01", token=TOKEN, controllers=[controller.url],
        work_root=work_root,
    )  # fmt: skip
    courier = Courier(tmp_path / "broker", TOKEN)
    go = work_root / "acme" / "go"
    script = f"#!/bin/bash\nwhile [ ! -e {go} ]; do sleep 0.05; done\nexit 0\n"
    with controller.client() as client:
        adopted, _ = run_job(client, courier, agent, script)
        agent.stop(signal.SIGKILL)  # no goodbye: its jobs' supervisors carry on
        agent.start()
        go.touch()
        job = settle(client, adopted, "COMPLETED")
        assert (job["exit_code"], job["signal"]) == (0, 0)


def test_a_job_that_vanished_without_a_report_ends_node_fail(
    tmp_path: Path, procs: Processes
) -> None:
    # The fault: the controller never compared a heartbeat's running list with what it
    # believed ran there; a job whose end was never reported ran for ever.
    controller = make_controller(tmp_path, procs, node_timeout_s=6)  # grace: 3 s
    with controller.client() as client:
        client.register_node(gpu_node("sim01").to_dict())
        lost, listed, requeued = (
            client.submit(spec(gpus_per_node=1, **kw).to_dict())["job_id"]
            for kw in ({}, {}, {"requeue": True})
        )
        for job_id in (lost, listed, requeued):
            settle(client, job_id, "RUNNING")
            client.report(JobReport("started", job_id, 1, "sim01", pid=100 + job_id))
        # The agent, heartbeating: one job still runs, the others are gone, unreported.
        began = time.monotonic()
        while time.monotonic() - began < 8:
            answer = client.heartbeat("sim01", [{"job_id": listed, "attempt": 1}])
            assert answer["kill"] == []
            if client.job(lost)["state"] != "RUNNING":
                break
            time.sleep(0.5)
        ended = time.monotonic() - began
        job = client.job(lost)
        assert job["state"] == "NODE_FAIL", job
        assert "vanished" in job["reason"]
        assert 3.0 <= ended < 6.0  # after the grace, before the node's own timeout
        again = client.job(requeued)  # back in the queue, and maybe running again
        assert (again["state"], again["attempt"]) in (("PENDING", 1), ("RUNNING", 2))
        assert client.job(listed)["state"] == "RUNNING"
        # A report arriving after the verdict is acknowledged and changes nothing.
        client.report(JobReport("finished", lost, 1, "sim01", exit_code=0))
        assert client.job(lost)["state"] == "NODE_FAIL"
