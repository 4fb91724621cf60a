"""A job's row of the portal's job tables (`portal/_job_row.html`), rendered once per
change and zone and kept.

The same row goes into the job list (50 a page), the dashboard's active jobs and every
websocket message of a change (one per open browser of the organisation), and most of a
history never changes again. Rendering a row through the template engine cost about as
much as everything else of a job list page together, so a row is kept, keyed by what it
shows: the job's values of `ROW_FIELDS`, the zone its times are shown in, and the
script prefix its link is built under. A change of any of them is another key, so a kept
row is never stale; nothing has to forget one. The template is given those fields only:
one it shows that the key leaves out would be blank, which
tests/spurcloud/portal/test_job_rows.py would see (the row against the template's
rendering of the whole job).

Kept per process, least recently used first out (`ROWS_KEPT` rows of about 1 KiB).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import tzinfo
from functools import lru_cache
from operator import itemgetter
from typing import Any

from django.template.loader import get_template
from django.urls import get_script_prefix
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

TEMPLATE = "portal/_job_row.html"
# What the row shows (exit_text reads state, exit_code and signal).
ROW_FIELDS = (
    "job_id",
    "seq",
    "array_job_id",
    "array_task_id",
    "name",
    "user",
    "partition",
    "state",
    "reason",
    "num_gpus",
    "nodes",
    "submit_time",
    "end_time",
    "exit_code",
    "signal",
)
ROWS_KEPT = 4096


_values = itemgetter(*ROW_FIELDS)
_NODES = ROW_FIELDS.index("nodes")


def _key(job: Mapping[str, Any]) -> tuple[Any, ...]:
    """The job's values of ROW_FIELDS, hashable (its node list as a tuple)."""
    values = list(_values(job))
    if isinstance(values[_NODES], list):
        values[_NODES] = tuple(values[_NODES])
    return tuple(values)


def job_row(job: Mapping[str, Any]) -> SafeString:
    """The row of `job` (a job object: at least `ROW_FIELDS`), its times in the zone
    active now."""
    return _row(_key(job), timezone.get_current_timezone(), get_script_prefix())


def job_rows(jobs: Iterable[Mapping[str, Any]]) -> list[SafeString]:
    zone, prefix = timezone.get_current_timezone(), get_script_prefix()
    return [_row(_key(job), zone, prefix) for job in jobs]


@lru_cache(maxsize=ROWS_KEPT)
def _row(values: tuple[Any, ...], zone: tzinfo, prefix: str) -> SafeString:
    """Called with the zone and the script prefix active now: they are what it renders
    with, and part of its key."""
    job = dict(zip(ROW_FIELDS, values, strict=True))
    return mark_safe(get_template(TEMPLATE).render({"job": job}).strip())
