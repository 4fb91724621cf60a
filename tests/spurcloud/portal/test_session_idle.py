"""A session's terminal on its page, and idle culling: who sees the terminal (and the page's
policy that lets xterm.js draw), the warning before an idle session is stopped, and the
periodic task that stops sessions nobody used for SPUR_SESSION_IDLE_MINUTES (a real
controller takes the cancels)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from spurcloud.headers import CONTENT_SECURITY_POLICY
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import submit_job
from spurcloud.portal import tasks
from spurcloud.portal.session_activity import last_session_activity, note_session_activity
from spurcloud.portal.session_culling import cull_idle_sessions, idle_sessions
from spurcloud.portal.sessions import session_templates
from spurcloud.tenants.models import Membership
from tests.spurcloud.portal.conftest import HTMX, browser, record

SESSION_SPEC = {"qos": "interactive", "comment": "spur-session:shell"}


def _session(job_id: int, *, user: str = "max", minutes_ago: int = 45, **fields: Any) -> None:
    record(job_id, user=user, state="RUNNING")
    JobRecord.objects.filter(job_id=job_id).update(
        spec=SESSION_SPEC,
        qos="interactive",
        start_time=timezone.now() - timedelta(minutes=minutes_ago),
        **fields,
    )


# -- the terminal on the page ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "own", "shown"),
    [
        ("owner", False, True),
        ("admin", False, True),
        ("member", True, True),
        ("member", False, False),  # someone else's session
        ("billing", False, False),
    ],
)
def test_the_terminal_is_on_the_page_of_those_who_may_open_it(
    who: str, own: bool, shown: bool, people: dict[str, Any]
) -> None:
    _session(30, user=people["member"].username if own else "someone")
    response = browser(people[who]).get("/sessions/30/")
    page = response.content.decode()
    assert ('id="session-terminal"' in page) == shown
    assert ('data-ws-path="/ws/sessions/30/terminal/"' in page) == shown
    assert ("vendor/xterm/xterm.js" in page) == shown
    policy = response["Content-Security-Policy"]
    if shown:  # xterm.js writes <style> elements; scripts stay this site's files only
        assert "style-src 'self' 'unsafe-inline'" in policy
        assert "script-src 'self';" in policy
    else:
        assert policy == CONTENT_SECURITY_POLICY


def test_an_outsider_sees_no_session_and_no_terminal(people: dict[str, Any]) -> None:
    _session(31)
    assert browser(people["outsider"]).get("/sessions/31/").status_code == 404


# -- the warning before an idle session is stopped -------------------------------------------


@pytest.mark.parametrize(
    ("minutes_ago", "used_minutes_ago", "warned"),
    [(55, None, True), (55, 1, False), (5, None, False), (120, 55, True)],
)
def test_the_page_warns_before_an_idle_session_is_stopped(
    minutes_ago: int,
    used_minutes_ago: int | None,
    warned: bool,
    people: dict[str, Any],
    settings: Any,
) -> None:
    settings.SPUR_SESSION_IDLE_MINUTES = 60
    settings.SPUR_SESSION_WARN_MIN = 10
    _session(32, minutes_ago=minutes_ago, time_limit_min=24 * 60)
    if used_minutes_ago is not None:
        note_session_activity(32, now=time.time() - used_minutes_ago * 60)
    page = browser(people["member"]).get("/sessions/32/status", headers=HTMX).content.decode()
    assert ('id="session-idle-warning"' in page) == warned
    if warned:
        assert "stops in 4 minutes" in page or "stops in 5 minutes" in page
    assert 'id="session-warning"' not in page  # the maximum duration is far


# -- culling -----------------------------------------------------------------------------------


def test_activity_is_kept_per_session(db: None) -> None:
    assert last_session_activity(40) is None
    note_session_activity(40, now=1000.0)
    note_session_activity(41, now=2000.0)
    assert (last_session_activity(40), last_session_activity(41)) == (1000.0, 2000.0)


def test_only_running_sessions_idle_past_the_limit_are_idle(
    people: dict[str, Any], settings: Any
) -> None:
    settings.SPUR_SESSION_IDLE_MINUTES = 30
    _session(50, minutes_ago=45)  # never used
    _session(51, minutes_ago=45)
    note_session_activity(51, now=time.time() - 60)  # used a minute ago
    _session(52, minutes_ago=45)
    note_session_activity(52, now=time.time() - 40 * 60)  # last used 40 minutes ago
    _session(53, minutes_ago=10)  # young
    _session(54, minutes_ago=45)
    JobRecord.objects.filter(job_id=54).update(state="COMPLETED")
    record(55, state="RUNNING")  # a batch job, however old
    JobRecord.objects.filter(job_id=55).update(start_time=timezone.now() - timedelta(days=1))
    assert [r.job_id for r in idle_sessions()] == [50, 52]


def _submit(people: dict[str, Any], who: str) -> int:
    member = Membership.objects.get(user=people[who])
    spec = {
        "script": session_templates()["shell"].script(60),
        "qos": "interactive",
        "comment": "spur-session:shell",
        "time_limit_min": 60,
    }
    job_id = int(
        submit_job(organization=member.organization, user=people[who], spec=spec)["job_id"]
    )
    # As the controller's event would mirror it: running since 45 minutes.
    JobRecord.objects.filter(job_id=job_id).update(
        state="RUNNING", start_time=timezone.now() - timedelta(minutes=45)
    )
    return job_id


def test_the_task_stops_idle_sessions_through_the_controller_and_leaves_used_ones(
    people: dict[str, Any], live_controller: Any, settings: Any
) -> None:
    settings.SPUR_SESSION_IDLE_MINUTES = 30
    idle, used = _submit(people, "member"), _submit(people, "admin")
    note_session_activity(used)
    assert tasks.cull_idle.apply().get() == 1
    client = live_controller.client()
    try:
        assert client.job(idle)["state"] in ("CANCELLED", "COMPLETING")
        assert client.job(used)["state"] not in ("CANCELLED", "COMPLETING")
    finally:
        client.close()
    assert JobRecord.objects.get(job_id=idle).state != "RUNNING"  # the answer was mirrored
    assert cull_idle_sessions() == []  # nothing twice


def test_a_session_whose_user_left_is_stopped_as_an_owner(
    people: dict[str, Any], live_controller: Any, settings: Any
) -> None:
    settings.SPUR_SESSION_IDLE_MINUTES = 30
    job_id = _submit(people, "member")
    Membership.objects.filter(user=people["member"]).delete()
    assert cull_idle_sessions() == [job_id]


def test_culling_runs_every_minute_from_beat() -> None:
    entry = django_settings.CELERY_BEAT_SCHEDULE["sessions-cull-idle"]
    assert entry == {"task": tasks.cull_idle.name, "schedule": 60.0}
