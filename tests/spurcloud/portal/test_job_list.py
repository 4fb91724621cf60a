"""/jobs/: the organisation's jobs, newest first, each row a link to its page; filters by
state, user and name; pages of 50."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.http import QueryDict
from django.template.loader import render_to_string
from django.test.utils import CaptureQueriesContext

from spurcloud.portal.job_forms import JobFilterForm
from spurcloud.portal.job_views import JOBS_PER_PAGE
from tests.spurcloud.portal.conftest import EVERYONE, ROLES, browser, record


@pytest.mark.parametrize("who", EVERYONE)
def test_each_sees_only_their_organisations_jobs_each_linked_to_its_page(
    who: str, people: dict[str, Any]
) -> None:
    record(41, name="acme-train")
    record(42, tenant="globex", user="oscar", name="gx-train")
    content = browser(people[who]).get("/jobs/").content.decode()
    if who == "outsider":  # globex's owner: their own organisation's list
        assert "gx-train" in content and "acme-train" not in content
        assert 'href="/jobs/42/"' in content
    else:
        assert "acme-train" in content and "gx-train" not in content
        assert '<a href="/jobs/41/">41</a>' in content


def test_nobody_signed_in_is_sent_to_sign_in(db: None) -> None:
    response = browser(None).get("/jobs/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("who", ROLES)
def test_filters_by_state_user_and_name(who: str, people: dict[str, Any]) -> None:
    record(1, name="a", user="max", state="RUNNING")
    record(2, name="b", user="olivia", state="RUNNING")
    record(3, name="a", user="olivia", state="COMPLETED")
    client = browser(people[who])

    def ids(**query: str) -> list[str]:
        page = client.get("/jobs/", query).content.decode()
        return [i for i in ("1", "2", "3") if f'data-job-id="{i}"' in page]

    assert ids() == ["1", "2", "3"]
    assert ids(state="RUNNING") == ["1", "2"]
    assert ids(user="olivia") == ["2", "3"]
    assert ids(name="a", user="olivia") == ["3"]
    assert ids(state="COMPLETED", name="b") == []


def test_a_filter_it_cannot_apply_says_why_and_shows_no_rows(people: dict[str, Any]) -> None:
    record(1)
    response = browser(people["member"]).get("/jobs/", {"state": "SLEEPING", "user": "x" * 151})
    assert response.status_code == 200
    content = response.content.decode()
    assert 'data-job-id="1"' not in content
    assert "Select a valid choice. SLEEPING is not one of the available choices." in content
    assert "Ensure this value has at most 150 characters" in content


def test_pages_of_fifty_newest_first_and_filters_kept_across_pages(
    people: dict[str, Any],
) -> None:
    for job_id in range(1, JOBS_PER_PAGE + 11):
        record(job_id, state="RUNNING")
    client = browser(people["member"])
    first = client.get("/jobs/", {"state": "RUNNING"}).content.decode()
    assert f'data-job-id="{JOBS_PER_PAGE + 10}"' in first and 'data-job-id="10"' not in first
    assert "Page 1 of 2 (60 jobs)" in first
    assert 'href="?state=RUNNING&amp;page=2"' in first
    # A later page (or a filtered one) keeps new jobs out of its live table.
    assert 'data-live-insert="off"' in first
    second = client.get("/jobs/", {"state": "RUNNING", "page": "2"}).content.decode()
    assert 'data-job-id="10"' in second and 'data-job-id="11"' not in second
    # A page number it has no page for is the last page, not an error.
    assert client.get("/jobs/", {"page": "999"}).status_code == 200
    assert 'data-live-insert="on"' in client.get("/jobs/").content.decode()


def test_the_list_costs_the_same_queries_for_ten_jobs_or_a_hundred(
    people: dict[str, Any],
) -> None:
    client = browser(people["member"])
    for job_id in range(1, 11):
        record(job_id)
    client.get("/jobs/")  # the session's first read
    with CaptureQueriesContext(connection) as few:
        client.get("/jobs/")
    for job_id in range(11, 101):
        record(job_id)
    with CaptureQueriesContext(connection) as many:
        client.get("/jobs/")
    assert len(many) == len(few)


@pytest.mark.parametrize(
    "data",
    [{}, {"state": "RUNNING", "user": "max"}, {"state": "SLEEPING", "name": "x" * 201}],
)
def test_the_filters_are_the_forms_own_rendering_of_their_values(data: dict[str, str]) -> None:
    form = JobFilterForm(QueryDict(urlencode(data)))
    own = render_to_string("portal/_job_filters.html", {"form": form})
    assert form.fields_html() == own
    assert JobFilterForm(QueryDict(urlencode(data))).fields_html() is form.fields_html()
    if "SLEEPING" in data.values():
        assert own.count('aria-invalid="true"') == 2
