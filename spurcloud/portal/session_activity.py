"""When an interactive session was last used: what idle culling counts from.

A session is in use while its web terminal relays keystrokes or output, or its Jupyter
proxy relays requests. Each of them calls `note_session_activity(job_id)` (the terminal
consumer at most once every NOTE_EVERY_S per socket, so a busy terminal does not write
the cache at every key); the cull task (session_culling.py) reads
`last_session_activity`. The time lives in the shared cache (Redis in production), not
in PostgreSQL: it changes every minute for every session in use, is worth nothing once
the session has ended, and losing it (a cache flush) only lets a session live one idle
period longer, since culling then counts from the session's start. It is the cache
every process shares (`caches["shared"]`): on the embedded platform, whose default
cache lives in each process's memory, the worker would never see what the web noted."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import caches

NOTE_EVERY_S = 30.0  # how often one socket in use writes the time (a fraction of a minute)
_KEY = "spur:session-activity:{}"


def _ttl_s() -> int:
    # Kept as long as a session can last, plus a margin: after that it has ended anyway.
    return int(settings.SPUR_SESSION_MAX_MINUTES) * 60 + 3600


def note_session_activity(job_id: int, *, now: float | None = None) -> None:
    """Someone used the session `job_id` (its terminal or its Jupyter) just now."""
    caches["shared"].set(_KEY.format(int(job_id)), time.time() if now is None else now, _ttl_s())


def last_session_activity(job_id: int) -> float | None:
    """When the session was last used (seconds since the epoch); None: never, as far as
    the cache knows."""
    value = caches["shared"].get(_KEY.format(int(job_id)))
    return float(value) if isinstance(value, int | float) else None


def last_session_activities(job_ids: list[int]) -> dict[int, float]:
    """`last_session_activity` of many sessions in one round trip."""
    found = caches["shared"].get_many([_KEY.format(int(j)) for j in job_ids])
    return {
        int(key.rsplit(":", 1)[1]): float(value)
        for key, value in found.items()
        if isinstance(value, int | float)
    }


__all__ = [
    "NOTE_EVERY_S",
    "last_session_activities",
    "last_session_activity",
    "note_session_activity",
]
