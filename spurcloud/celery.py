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
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
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


filequeue.register()  # filesystem:// writes whole messages only (see scheduler/filequeue.py)
app = Celery("spurcloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
keep_connections(app)
