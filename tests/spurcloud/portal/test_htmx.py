"""htmx in the portal (spurcloud/portal/htmx.py): a request from htmx (`HX-Request`) gets
the fragment its element swaps, with the messages out of band; any other request, and
htmx's reload of a page from history, the whole page; a redirect reaches htmx as
`HX-Redirect`. htmx itself is served from this site under the page's policy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders

from spurcloud.headers import CONTENT_SECURITY_POLICY
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import submit_job
from spurcloud.tenants.models import Membership
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import HTMX, browser, record

RESTORE = {**HTMX, "HX-History-Restore-Request": "true"}


def _is_fragment(content: bytes) -> bool:
    return b"<html" not in content and b"<header" not in content


def test_htmx_is_served_from_this_site_with_its_licence_and_every_page_loads_it(
    people: dict[str, Any],
) -> None:
    for name in ("htmx.min.js", "LICENSE", "README.md"):
        assert finders.find(f"vendor/htmx/{name}"), name
    assert "Zero-Clause BSD" in Path(str(finders.find("vendor/htmx/LICENSE"))).read_text()
    assert 'version:"2.0.11"' in Path(str(finders.find("vendor/htmx/htmx.min.js"))).read_text()
    response = browser(people["member"]).get("/")
    page = response.content.decode()
    assert '<script src="/static/vendor/htmx/htmx.min.js" defer></script>' in page
    # The policy runs it as a file of this site; nothing else is needed for it.
    assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY


def test_htmx_is_told_to_need_nothing_the_policy_forbids_and_to_keep_no_page(
    people: dict[str, Any],
) -> None:
    page = browser(people["member"]).get("/").content.decode()
    config = json.loads(re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page)[1])  # type: ignore[index]
    # Its indicator <style>, eval (hx-on, filters) and scripts in fragments: all inline.
    assert config["includeIndicatorStyles"] is False and config["allowEval"] is False
    assert config["allowScriptTags"] is False
    # No copy of a page in the browser's storage, where it would outlive signing out.
    assert config["historyCacheSize"] == 0 and config["refreshOnHistoryMiss"] is True


# -- the job list: filters and pages ----------------------------------------------------


def test_the_job_lists_filters_swap_the_results_alone_and_a_page_load_gets_the_page(
    people: dict[str, Any],
) -> None:
    record(1, name="a", state="RUNNING")
    record(2, name="b", state="COMPLETED")
    client = browser(people["member"])
    part = client.get("/jobs/", {"state": "RUNNING"}, headers=HTMX)
    assert part.status_code == 200 and _is_fragment(part.content)
    text = part.content.decode()
    assert '<div id="jobs-results">' in text
    assert 'data-job-id="1"' in text and 'data-job-id="2"' not in text
    assert 'data-live-insert="off"' in text and 'class="filters"' not in text
    assert "HX-Request" in part["Vary"]
    for headers in ({}, RESTORE):  # a page load, and htmx reloading one from history
        whole = client.get("/jobs/", {"state": "RUNNING"}, headers=headers)
        assert b"<html" in whole.content and b'class="filters"' in whole.content
        assert "HX-Request" in whole["Vary"]
    page = client.get("/jobs/").content.decode()
    assert 'hx-get="/jobs/"' in page and 'hx-target="#jobs-results"' in page
    assert 'hx-push-url="true"' in page


def test_a_filter_it_cannot_apply_says_why_in_the_fragment(people: dict[str, Any]) -> None:
    record(1)
    part = browser(people["member"]).get("/jobs/", {"state": "SLEEPING"}, headers=HTMX)
    text = part.content.decode()
    assert _is_fragment(part.content) and 'role="alert"' in text
    assert "SLEEPING is not one of the available choices" in text
    assert 'data-job-id="1"' not in text


def test_the_job_lists_pages_swap_the_results_and_keep_the_filters(
    people: dict[str, Any],
) -> None:
    for job_id in range(1, 61):
        record(job_id, state="RUNNING")
    client = browser(people["member"])
    first = client.get("/jobs/", {"state": "RUNNING"}).content.decode()
    assert 'hx-get="?state=RUNNING&amp;page=2"' in first
    second = client.get("/jobs/", {"state": "RUNNING", "page": "2"}, headers=HTMX)
    text = second.content.decode()
    assert _is_fragment(second.content)
    assert 'data-job-id="10"' in text and 'data-job-id="11"' not in text
    assert "Page 2 of 2 (60 jobs)" in text and 'hx-get="?state=RUNNING&amp;page=1"' in text


# -- job actions -----------------------------------------------------------------------


@pytest.fixture
def held(acme: Tenant, live_controller: Any) -> int:
    job = submit_job(
        organization=acme.organization,
        user=acme.owner,
        spec={"script": "#!/bin/sh\ntrue\n", "hold": True, "name": "held"},
    )
    return int(job["job_id"])


def test_a_job_action_by_htmx_answers_with_the_jobs_facts_and_the_message(
    people: dict[str, Any], held: int
) -> None:
    client = browser(people["owner"])
    page = client.get(f"/jobs/{held}/").content.decode()
    assert f'hx-post="/jobs/{held}/cancel" hx-target="#job-summary"' in page
    part = client.post(f"/jobs/{held}/cancel", headers=HTMX)
    assert part.status_code == 200 and _is_fragment(part.content)
    text = part.content.decode()
    assert '<section class="card" id="job-summary">' in text
    assert 'id="job-state">CANCELLED<' in text
    assert f'action="/jobs/{held}/' not in text  # over: no actions left
    # The message, for the page's own message area.
    assert '<div id="messages" role="status" hx-swap-oob="innerHTML">' in text
    assert f"Job {held}: cancel requested." in text
    assert JobRecord.objects.get(job_id=held).state == "CANCELLED"


def test_a_refused_job_action_by_htmx_says_why_and_changes_nothing(
    people: dict[str, Any], held: int
) -> None:
    part = browser(people["member"]).post(f"/jobs/{held}/cancel", headers=HTMX)
    text = part.content.decode()
    assert _is_fragment(part.content) and 'class="error"' in text
    assert "You can cancel only your own jobs." in text and 'id="job-state">PENDING<' in text
    assert JobRecord.objects.get(job_id=held).state == "PENDING"


def test_an_outsiders_job_action_by_htmx_is_the_same_404(people: dict[str, Any], held: int) -> None:
    assert browser(people["outsider"]).post(f"/jobs/{held}/cancel", headers=HTMX).status_code == 404
    assert JobRecord.objects.get(job_id=held).state == "PENDING"


# -- a session's live part and its Stop -------------------------------------------------


def _session(job_id: int, state: str) -> None:
    record(job_id, state=state)
    JobRecord.objects.filter(job_id=job_id).update(
        spec={"qos": "interactive", "comment": "spur-session:shell"}, qos="interactive"
    )


def test_a_sessions_status_polls_until_it_has_ended(people: dict[str, Any]) -> None:
    _session(7, "PENDING")
    client = browser(people["member"])
    page = client.get("/sessions/7/").content.decode()
    assert 'hx-get="/sessions/7/status" hx-trigger="every 3s" hx-swap="outerHTML"' in page
    assert "js/session.js" not in page
    part = client.get("/sessions/7/status", headers=HTMX)
    assert _is_fragment(part.content) and b'<div id="session-status-body" hx-get=' in part.content
    assert part["Cache-Control"] == "no-store" and "HX-Request" in part["Vary"]
    JobRecord.objects.filter(job_id=7).update(state="CANCELLED")
    ended = client.get("/sessions/7/status", headers=HTMX).content.decode()
    # Without its trigger the fragment that says "ended" is the last one fetched.
    assert 'data-phase="ended"' in ended and "hx-trigger" not in ended
    # Its address opened in the browser: the session's page.
    assert client.get("/sessions/7/status")["Location"] == "/sessions/7/"


def test_stop_by_htmx_answers_with_the_sessions_live_part(
    people: dict[str, Any], live_controller: Any
) -> None:
    membership = Membership.objects.get(user=people["member"])
    job = submit_job(
        organization=membership.organization,
        user=people["member"],
        spec={
            "script": "#!/bin/sh\nsleep 60\n",
            "hold": True,
            "qos": "interactive",
            "comment": "spur-session:shell",
        },
    )
    job_id = int(job["job_id"])
    client = browser(people["member"])
    page = client.get(f"/sessions/{job_id}/").content.decode()
    assert f'hx-post="/sessions/{job_id}/stop" hx-target="#session-status-body"' in page
    part = client.post(f"/sessions/{job_id}/stop", headers=HTMX)
    text = part.content.decode()
    assert _is_fragment(part.content) and 'data-phase="ended"' in text
    assert f"Session {job_id}: stopping." in text and 'hx-swap-oob="innerHTML"' in text


# -- the organisation's members ---------------------------------------------------------


def _member_id(people: dict[str, Any], who: str) -> int:
    return Membership.objects.get(user=people[who]).pk


def test_removing_a_member_by_htmx_answers_with_the_members_card(
    people: dict[str, Any],
) -> None:
    target = _member_id(people, "member")
    page = browser(people["owner"]).get("/organization/").content.decode()
    assert f'hx-post="/organization/members/{target}/remove" hx-target="#members"' in page
    part = browser(people["owner"]).post(f"/organization/members/{target}/remove", headers=HTMX)
    text = part.content.decode()
    assert part.status_code == 200 and _is_fragment(part.content)
    assert '<section class="card" id="members"' in text and "<td>max@example.com" not in text
    assert "max@example.com is no longer a member." in text  # the message, out of band
    assert "Audit log" not in text  # the card alone
    plain = browser(people["owner"]).post(
        f"/organization/members/{_member_id(people, 'billing')}/remove"
    )
    assert plain.status_code == 302 and plain["Location"] == "/organization/"


def test_changing_a_role_by_htmx_answers_with_the_members_card(people: dict[str, Any]) -> None:
    target = _member_id(people, "member")
    part = browser(people["admin"]).post(
        f"/organization/members/{target}/role", {"role": "billing"}, headers=HTMX
    )
    text = part.content.decode()
    assert _is_fragment(part.content) and '<section class="card" id="members"' in text
    assert "max@example.com is now billing." in text
    assert Membership.objects.get(pk=target).role == "billing"


def test_leaving_by_htmx_is_a_redirect_that_htmx_follows(people: dict[str, Any]) -> None:
    part = browser(people["member"]).post(
        f"/organization/members/{_member_id(people, 'member')}/remove", headers=HTMX
    )
    assert (part.status_code, part["HX-Redirect"]) == (204, "/")
    assert not Membership.objects.filter(user=people["member"]).exists()


def test_a_signed_out_htmx_request_is_sent_to_sign_in_as_a_whole_page(db: None) -> None:
    part = browser(None).get("/sessions/7/status", headers=HTMX)
    assert part.status_code == 204 and part["HX-Redirect"].startswith("/accounts/login/")
    assert part.content == b""
    # Outside htmx a redirect stays a redirect.
    assert browser(None).get("/sessions/7/status").status_code == 302
