"""Celery's per-task "received" and "succeeded" lines: at DEBUG for the tasks declared
`trace_at_debug` (those the controller sends for every job), at INFO for the others;
retries and failures logged as before, for every task."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery.app.trace import LOG_RECEIVED
from celery.worker import strategy

from spurcloud.celery import TRACE_LOGGERS, app
from spurcloud.jobs import tasks


@app.task(name="tests.trace.quiet", trace_at_debug=True, ignore_result=True)  # type: ignore[untyped-decorator]
def quiet(x: int) -> int:
    return x


@app.task(name="tests.trace.loud", ignore_result=True)  # type: ignore[untyped-decorator]
def loud(x: int) -> int:
    return x


@app.task(name="tests.trace.fails", trace_at_debug=True, ignore_result=True)  # type: ignore[untyped-decorator]
def fails() -> None:
    raise RuntimeError("boom")


@app.task(  # type: ignore[untyped-decorator]
    name="tests.trace.retries", trace_at_debug=True, bind=True, ignore_result=True
)
def retries(self: Any) -> None:
    raise self.retry(countdown=5, exc=RuntimeError("again"), max_retries=3)


def lines(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if name in r.getMessage()]


def at(caplog: pytest.LogCaptureFixture, level: int) -> None:
    for logger in TRACE_LOGGERS:
        caplog.set_level(level, logger=logger)


def test_the_controllers_per_job_tasks_are_declared_quiet() -> None:
    assert tasks.launch_jobs.trace_at_debug and tasks.job_events.trace_at_debug
    assert not getattr(tasks.signal_job, "trace_at_debug", False)


def test_a_quiet_tasks_success_is_not_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    at(caplog, logging.INFO)
    quiet.apply(args=[1])
    loud.apply(args=[1])
    assert lines(caplog, "tests.trace.quiet") == []
    [(level, line)] = lines(caplog, "tests.trace.loud")
    assert level == logging.INFO and "succeeded" in line


def test_at_debug_a_quiet_tasks_success_is_logged_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    at(caplog, logging.DEBUG)
    quiet.apply(args=[1])
    [(level, line)] = lines(caplog, "tests.trace.quiet")
    assert level == logging.DEBUG and "succeeded" in line


def test_a_quiet_tasks_failure_and_retry_are_logged_as_any_tasks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    at(caplog, logging.INFO)
    fails.apply()
    retries.apply()
    [(level, line)] = lines(caplog, "tests.trace.fails")
    assert level == logging.ERROR and "boom" in line
    # Applied in place, a retry runs at once: three retries, then it gives up.
    logged = lines(caplog, "tests.trace.retries")
    assert [level for level, _ in logged] == [logging.INFO] * 3 + [logging.ERROR]
    assert all("again" in line for _, line in logged) and "retry" in logged[0][1]


@pytest.mark.parametrize(
    ("name", "level", "expected"),
    [
        ("tests.trace.quiet", logging.INFO, []),
        ("tests.trace.quiet", logging.DEBUG, [logging.DEBUG]),
        ("tests.trace.loud", logging.INFO, [logging.INFO]),
        ("no.such.task", logging.INFO, [logging.INFO]),  # as Celery logs it
    ],
)
def test_the_received_line_follows_the_task(
    caplog: pytest.LogCaptureFixture, name: str, level: int, expected: list[int]
) -> None:
    """Logged where the worker's strategy logs it (its logger, its arguments)."""
    at(caplog, level)
    context = {"id": "1", "name": name, "args": "[]", "kwargs": "{}", "eta": None}
    strategy.logger.info(LOG_RECEIVED, context, extra={"data": context})
    assert [level for level, _ in lines(caplog, name)] == expected


def test_a_record_without_the_task_name_is_left_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    at(caplog, logging.INFO)
    strategy.logger.info(LOG_RECEIVED, SimpleNamespace(name="x").__dict__)
    assert [r.levelno for r in caplog.records if r.name == strategy.logger.name] == [logging.INFO]


class _Agent:
    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results = results

    def launch_all(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.results


def _launch(caplog: pytest.LogCaptureFixture, monkeypatch: Any, result: dict[str, Any]) -> None:
    monkeypatch.setattr(tasks, "agent_client", lambda url: _Agent([result]))
    caplog.set_level(logging.INFO, logger=tasks.log.name)
    at(caplog, logging.INFO)
    payload = {"job_id": 7, "cmd_id": 3, "attempt": 0, "node": "n1", "agent_url": "http://a"}
    tasks.launch_jobs.apply(args=[[payload]])


def test_a_launch_the_agent_took_logs_nothing_at_info(
    caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    """The controller logs each launch it sends; the worker, one a job, only what failed."""
    _launch(caplog, monkeypatch, {"job_id": 7})
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


def test_a_launch_the_agent_refused_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    _launch(caplog, monkeypatch, {"error": {"status": 409, "detail": "no such account"}})
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert "job 7" in line and "refused launch" in line and "no such account" in line
