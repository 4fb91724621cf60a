"""spur.launch_job and spur.signal_job: retried with backoff while the agent is unreachable,
given up at once when it refuses."""

from __future__ import annotations

from typing import Any

import pytest
from celery.signals import task_retry

from scheduler.rpc.errors import Unavailable
from spurcloud.jobs.tasks import backoff_s, launch_job, signal_job
from tests.fixtures.processes import free_port


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

    task_retry.connect(count, sender=launch_job)
    try:
        # Eager: each retry runs at once, in this process (no broker), until max_retries.
        result = launch_job.apply(args=[payload])
    finally:
        task_retry.disconnect(count, sender=launch_job)
    assert result.state == "FAILURE"
    assert isinstance(result.result, Unavailable)
    assert len(retries) == launch_job.max_retries == settings.SPUR_AGENT_MAX_RETRIES


@pytest.mark.django_db(transaction=True)
def test_a_refusing_agent_is_not_retried(live_server: Any) -> None:
    # Any HTTP server that answers 4xx to the agent routes is a refusing agent; this one is
    # the web app itself, which has no /v1/jobs/{id}/launch.
    for task in (launch_job, signal_job):
        result = task.apply(args=[_payload(live_server.url)])
        assert result.state == "SUCCESS"
        assert result.result is None
