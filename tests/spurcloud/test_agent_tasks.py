"""spur.launch_jobs and spur.signal_job: retried with backoff while the agent is
unreachable, given up at once when it refuses; a batch of launches is delivered to a real
agent in one request, a refused launch dropped and its neighbours started."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from celery.signals import task_retry
from django.conf import settings

from agents.api import create_app
from agents.identity import Identities
from agents.launcher import Launcher
from scheduler.rpc.errors import Unavailable
from spurcloud.jobs.tasks import backoff_s, launch_jobs, signal_job
from tests.agents.conftest import TENANT, make_payload
from tests.fixtures.processes import free_port, wait_until


def _payload(agent_url: str) -> dict[str, Any]:
    return {
        "job_id": 5,
        "attempt": 1,
        "node": "node01",
        "agent_url": agent_url,
        "cluster_name": "spur",
        "signal": 15,
        "kill_after_s": None,
        "job": {"job_id": 5, "spec": {"script": "#!/bin/sh\n"}},
    }


def test_the_backoff_doubles_and_is_capped_at_a_minute() -> None:
    assert [backoff_s(n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_s(30) == 60.0


def test_an_unreachable_agent_is_retried_until_the_retries_run_out(settings: Any) -> None:
    settings.SPUR_AGENT_TIMEOUT_S = 1.0
    payload = _payload(f"http://127.0.0.1:{free_port()}")
    retries: list[float] = []

    def count(request: Any, reason: Any, **kwargs: Any) -> None:
        retries.append(1)

    task_retry.connect(count, sender=launch_jobs)
    try:
        # Eager: each retry runs at once, in this process (no broker), until max_retries.
        result = launch_jobs.apply(args=[[payload]])
    finally:
        task_retry.disconnect(count, sender=launch_jobs)
    assert result.state == "FAILURE"
    assert isinstance(result.result, Unavailable)
    assert len(retries) == launch_jobs.max_retries == settings.SPUR_AGENT_MAX_RETRIES


@pytest.mark.django_db(transaction=True)
def test_a_refusing_agent_is_not_retried(live_server: Any) -> None:
    # Any HTTP server that answers 4xx to the agent routes is a refusing agent; this one is
    # the web app itself, which has no /v1/jobs/{id}/launch.
    for task, arg in (
        (launch_jobs, [_payload(live_server.url)]),
        (signal_job, _payload(live_server.url)),
    ):
        result = task.apply(args=[arg])
        assert result.state == "SUCCESS"
        assert result.result is None


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, Launcher, Path]]:
    """A real agent's API (its launcher starts real sandboxes) on a port: its URL, its
    launcher, and the workspace its jobs may run in."""
    reachable = Path(tempfile.mkdtemp(prefix="spur-tests-", dir="/tmp"))
    reachable.chmod(0o711)
    identities = Identities() if os.geteuid() == 0 else Identities(personal=True)
    launcher = Launcher(
        node="sim01",
        spool_dir=tmp_path / "spool",
        reporter=_Reports(),
        cluster_name="testcluster",
        work_root=reachable / "work",
        identities=identities,
    )
    workspace = launcher.workspaces.ensure(TENANT, identities.for_job(tenant=TENANT, user="alice"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(launcher=launcher, token=settings.SPUR_CLUSTER_TOKEN),
                       log_level="warning")
    )  # fmt: skip
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=10, what="the agent's API")
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", launcher, workspace
    server.should_exit = True
    thread.join(5)
    sock.close()
    launcher.kill_all(timeout=5)
    shutil.rmtree(reachable, ignore_errors=True)


class _Reports:
    def report(self, report: Any) -> None:
        pass


def test_a_batch_of_launches_reaches_the_agent_in_one_task_in_order(
    agent: tuple[str, Launcher, Path],
) -> None:
    url, launcher, workspace = agent
    batch = [make_payload(j, "#!/bin/sh\nsleep 60\n", workdir=str(workspace)) for j in (3, 1, 2)]
    batch[1]["node"] = "sim09"  # not this agent's: refused, its neighbours run
    for payload in batch:
        payload["agent_url"] = url
    result = launch_jobs.apply(args=[batch])
    assert result.state == "SUCCESS", result.result
    assert [
        (r["job_id"], r.get("accepted"), r.get("error", {}).get("status")) for r in result.result
    ] == [
        (3, True, None),
        (1, None, 400),
        (2, True, None),
    ]
    assert [j["job_id"] for j in launcher.running()] == [3, 2]
    again = launch_jobs.apply(args=[batch]).result  # redelivered: nothing runs twice
    assert [r.get("duplicate") for r in again] == [True, None, True]
    assert [j["job_id"] for j in launcher.running()] == [3, 2]
