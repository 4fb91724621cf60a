"""A job's row of the live tables (portal/job_rows.py): the template's own rendering of
the job, kept per change and zone, so a history page renders only what changed, and a
change reaches a hundred browsers for one rendering."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from zoneinfo import ZoneInfo

from django.template.loader import render_to_string
from django.test.signals import template_rendered
from django.utils import timezone

from spurcloud.jobs.jobobject import from_controller
from spurcloud.portal.job_rows import TEMPLATE, job_row, job_rows
from tests.spurcloud.conftest import job_dict

_ids = itertools.count(9_000_001)  # rows are kept for the process: each test its own jobs


def _job(**changes: Any) -> dict[str, Any]:
    """A web job object with every field the contract has, none of them empty."""
    job = job_dict(next(_ids), tenant="acme", user="max", **changes)
    return from_controller({**job, "seq": 5})


@contextmanager
def _renders() -> Iterator[list[Any]]:
    """The row template's renderings meanwhile (the test environment's signal)."""
    rendered: list[Any] = []

    def note(sender: Any, template: Any, **kwargs: Any) -> None:
        if template.name == TEMPLATE:
            rendered.append(template)

    template_rendered.connect(note)
    try:
        yield rendered
    finally:
        template_rendered.disconnect(note)


def test_the_row_is_the_templates_rendering_of_the_whole_job() -> None:
    # What the key leaves out is not given to the template: a field that the template
    # shows and the key misses would be blank here, and this would fail.
    for job in (
        _job(),
        _job(state="FAILED", reason="NonZeroExitCode", exit_code=3, nodes=["n1", "n2"]),
        _job(state="CANCELLED", signal=15, array_job_id=40, array_task_id=2, end_time=1.0e9),
    ):
        whole = render_to_string(TEMPLATE, {"job": job}).strip()
        assert job_row(job) == whole
        assert job_rows([job]) == [whole]


def test_a_row_is_rendered_once_for_each_change_and_zone() -> None:
    with _renders() as rendered:
        job = _job(state="RUNNING", reason="None", nodes=["n1"], start_time=1.0e9)
        first = job_row(job)
        assert job_rows([dict(job), dict(job)]) == [first, first]
        assert len(rendered) == 1
        ended = job_row({**job, "seq": 6, "state": "COMPLETED", "exit_code": 0})
        assert 'state-succeeded">COMPLETED<' in ended and ended != first
        assert len(rendered) == 2
        with timezone.override(ZoneInfo("Asia/Tokyo")):
            assert " JST</td>" in job_row(job)
        assert " UTC</td>" in job_row(job)
        assert len(rendered) == 3
