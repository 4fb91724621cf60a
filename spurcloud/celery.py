"""The Celery app: `celery -A spurcloud worker`.

Its configuration is the `CELERY_*` part of spurcloud/settings.py (broker, acks_late,
reject_on_worker_lost). The controller sends tasks to it by name (`spur.launch_jobs`,
`spur.signal_job`, `spur.job_events`; see docs/architecture.md) without importing Django.

Each worker thread keeps its database connection from one task to the next, as a web
request's thread does (spurcloud/asgi_http.py): Celery's Django fixup closes every
connection before and after each task unless `CELERY_DB_REUSE_MAX` is set, so each
`spur.job_events` opened one (SQLite: a file and its PRAGMAs; PostgreSQL: a TCP
connection, its authentication and a server process). `KeptConnections` has each task's
start and end do what a Django request's do, `close_old_connections`: a connection that
is older than `CONN_MAX_AGE`, broken, or left in a failed transaction is closed (and the
next query opens a fresh one), any other is kept.

Celery logs two INFO lines for every task ("Task ... received", "Task ... succeeded in
..."). For the tasks the controller sends for every job (`spur.launch_jobs`,
`spur.job_events`) those lines were most of the worker's log and a twentieth of its CPU
(formatting and writing them), and say nothing that other lines do not (the controller
logs each launch it sends by job, attempt and node; the tasks log what went wrong). A
task declared with `trace_at_debug=True` has them at DEBUG instead (`--loglevel DEBUG`
shows them again); its retries and failures are logged as any task's.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup

from scheduler import filequeue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "spurcloud.settings")


class KeptConnections(DjangoWorkerFixup):  # type: ignore[misc]  # Celery ships no types
    def close_database(self, **kwargs: Any) -> None:
        from django.db import close_old_connections

        close_old_connections()


def keep_connections(app: Celery) -> None:
    """Installs `KeptConnections` as the Django fixup's worker half (before the worker
    starts: Celery installs it on `worker_init`)."""
    for fixup in getattr(app, "_fixups", ()):
        if isinstance(fixup, DjangoFixup):
            fixup.worker_fixup = KeptConnections(app)


class TraceAtDebug(logging.Filter):
    """Moves the "received" and "succeeded" lines of a task declared with
    `trace_at_debug=True` to DEBUG: dropped unless the logger shows DEBUG."""

    def __init__(self, app: Celery) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in (LOG_SUCCESS, LOG_RECEIVED):
            return True  # a retry, a failure, anything else: as Celery logs it
        data = getattr(record, "data", None)
        name = data.get("name") if isinstance(data, dict) else None
        if not getattr(self.app.tasks.get(name), "trace_at_debug", False):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


# Where Celery logs those lines: the worker's strategy (received) and tracer (succeeded).
TRACE_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def trace_at_debug(app: Celery) -> None:
    """Installs `TraceAtDebug` on the loggers of Celery's per-task lines."""
    for name in TRACE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, TraceAtDebug) for f in logger.filters):
            logger.addFilter(TraceAtDebug(app))


filequeue.register()  # filesystem:// writes whole messages only (see scheduler/filequeue.py)
app = Celery("spurcloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
keep_connections(app)
trace_at_debug(app)
