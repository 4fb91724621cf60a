"""The portal's Celery task: idle sessions' culling (settings.CELERY_BEAT_SCHEDULE runs it
every minute). Thin and idempotent: stopping a stopped session is refused, and skipped."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from spurcloud.portal.session_culling import cull_idle_sessions


@shared_task(  # type: ignore[untyped-decorator]
    name="spur.sessions.cull_idle",
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    max_retries=3,
    acks_late=True,
    ignore_result=True,
)
def cull_idle() -> int:
    return len(cull_idle_sessions())
