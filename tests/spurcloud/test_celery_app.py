"""The worker's Django fixup: a worker thread keeps its database connection between tasks
(as a request's thread does) and still drops one that is too old."""

from __future__ import annotations

import pytest
from celery.fixups.django import DjangoFixup
from django.db import connection

from spurcloud.celery import KeptConnections, app
from spurcloud.jobs.tasks import job_events


def test_the_app_installs_the_fixup_that_keeps_connections() -> None:
    (fixup,) = [f for f in app._fixups if isinstance(f, DjangoFixup)]
    assert isinstance(fixup.worker_fixup, KeptConnections)


@pytest.mark.django_db(transaction=True)
def test_a_task_keeps_its_threads_connection_for_the_next() -> None:
    before = connection.settings_dict["CONN_MAX_AGE"]
    connection.settings_dict["CONN_MAX_AGE"] = 60
    try:
        connection.close()
        connection.ensure_connection()
        raw = connection.connection
        fixup = KeptConnections(app)
        fixup.on_task_postrun(sender=job_events)
        fixup.on_task_prerun(sender=job_events)
        assert connection.connection is raw
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = before


@pytest.mark.django_db(transaction=True)
def test_a_connection_past_its_age_is_closed_between_tasks() -> None:
    before = connection.settings_dict["CONN_MAX_AGE"]
    connection.settings_dict["CONN_MAX_AGE"] = 0
    try:
        connection.close()
        connection.ensure_connection()
        KeptConnections(app).on_task_postrun(sender=job_events)
        assert connection.connection is None
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = before
