"""Interactive sessions: templates, the launcher on /launch/ (a real controller), a
session's page and its live status fragment, its lifecycle, the warning before its
maximum duration, and Stop; seen as owner, admin, member, billing and outsider."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import BILLING_ROLE_MESSAGE
from spurcloud.portal import session_views
from spurcloud.portal.sessions import (
    READY_LINE,
    Phase,
    phase,
    session_templates,
    template_key,
)
from tests.spurcloud.portal.conftest import EVERYONE, HTMX, ROLES, RUNNERS, browser, record

SESSION_SPEC = {"qos": "interactive", "comment": "spur-session:shell", "gpu_type": "h100"}


def _launch_data(client: Any, **changes: str) -> dict[str, str]:
    page = client.get("/launch/").content.decode()
    keys = re.findall(r'name="session-idempotency_key" value="([0-9a-f]{32})"', page)
    assert len(keys) == 1
    data = {
        "session-idempotency_key": keys[0],
        "session-template": "shell",
        "session-gpus": "1",
        "session-max_minutes": "30",
    }
    return {**data, **changes}


def _session(job_id: int, *, state: str = "PENDING", user: str = "max", **fields: Any) -> None:
    record(job_id, user=user, state=state)
    JobRecord.objects.filter(job_id=job_id).update(spec=SESSION_SPEC, qos="interactive", **fields)


# -- templates and lifecycle ----------------------------------------------------------------


def test_the_built_in_templates_are_a_shell_and_pytorch_with_jupyterlab() -> None:
    templates = session_templates()
    assert list(templates) == ["shell", "pytorch-jupyter"]
    script = templates["pytorch-jupyter"].script(30)
    assert script.startswith("#!/bin/sh\n")
    # On the socket the agent's proxy reaches, under the portal's path: never on a port.
    assert 'jupyter lab --no-browser --sock "$SPUR_SESSION_SOCKET"' in script
    assert '--ServerApp.base_url="$SPUR_SESSION_BASE_URL"' in script
    assert "--ip" not in script and "--port" not in script
    assert 'SPUR_SESSION_SOCKET="$PWD/.spur-session-$SLURM_JOB_ID.sock"' in script
    assert 'SPUR_SESSION_BASE_URL="/sessions/$SLURM_JOB_ID/jupyter/"' in script
    assert script.index("export SPUR_SESSION_SOCKET") < script.index("jupyter lab")
    assert script.index(READY_LINE) > script.index("jupyter lab")
    assert templates["pytorch-jupyter"].web == "JupyterLab" and not templates["shell"].web
    assert script.rstrip().endswith("exec sleep 1860")  # the time limit ends it first


def test_an_operator_adds_and_replaces_templates(settings: Any) -> None:
    settings.SPUR_SESSION_TEMPLATES = [
        {"key": "vllm", "title": "vLLM server", "service": "vllm serve my-model"},
        {"key": "shell", "title": "Bash", "setup": "module load cuda"},
    ]
    templates = session_templates()
    assert list(templates) == ["shell", "pytorch-jupyter", "vllm"]
    assert templates["shell"].title == "Bash"
    assert "module load cuda" in templates["shell"].script(5)
    settings.SPUR_SESSION_TEMPLATES = [{"key": "Bad Key!", "title": "x"}]
    with pytest.raises(ImproperlyConfigured, match="key"):
        session_templates()
    settings.SPUR_SESSION_TEMPLATES = [{"key": "x", "title": "x", "port": "80"}]
    with pytest.raises(ImproperlyConfigured, match="only"):
        session_templates()


@pytest.mark.parametrize(
    ("state", "ready", "expected"),
    [
        ("PENDING", False, Phase.PENDING),
        ("RUNNING", False, Phase.STARTING),
        ("RUNNING", True, Phase.RUNNING),
        ("COMPLETING", True, Phase.STOPPING),
        ("CANCELLED", False, Phase.ENDED),
        ("TIMEOUT", False, Phase.ENDED),
        ("COMPLETED", True, Phase.ENDED),
    ],
)
def test_the_lifecycle_follows_the_job(state: str, ready: bool, expected: Phase) -> None:
    assert phase(state, ready=ready) is expected


def test_only_an_interactive_job_with_the_sessions_comment_is_a_session() -> None:
    assert template_key(SESSION_SPEC) == "shell"
    assert template_key({**SESSION_SPEC, "qos": "normal"}) is None
    assert template_key({"qos": "interactive", "comment": "mine"}) is None
    assert template_key(None) is None


# -- launching ------------------------------------------------------------------------------


@pytest.mark.parametrize("who", RUNNERS)
def test_a_runner_starts_a_session_and_lands_on_its_page(
    who: str, people: dict[str, Any], live_controller: Any
) -> None:
    client = browser(people[who])
    page = client.get("/launch/").content.decode()
    assert '<option value="shell">Shell</option>' in page
    assert '<option value="pytorch-jupyter">PyTorch + JupyterLab</option>' in page
    for field in ("template", "gpu_type", "gpus", "gpu_fraction", "max_minutes"):
        assert f'<label for="id_session-{field}">' in page
    data = _launch_data(client, **{"session-gpu_type": "h100"})
    response = client.post("/sessions/launch", data)
    assert response.status_code == 302
    job_id = int(response["Location"].strip("/").rsplit("/", 1)[-1])
    assert response["Location"] == f"/sessions/{job_id}/"
    job = JobRecord.objects.get(job_id=job_id)
    assert job.spec is not None and job.user == people[who].username
    assert (job.spec["qos"], job.spec["comment"]) == ("interactive", "spur-session:shell")
    assert (job.spec["gpu_type"], job.spec["gpus"], job.time_limit_min) == ("h100", 1, 30)
    assert READY_LINE in job.spec["script"]
    again = client.post("/sessions/launch", data)  # a resent form: the same session
    assert again["Location"] == f"/sessions/{job_id}/"
    page = client.get(f"/sessions/{job_id}/").content.decode()
    assert "Session " + str(job_id) + ": Shell" in page
    # Kept live by htmx, served from this site (no inline script: CSP).
    assert f'hx-get="/sessions/{job_id}/status" hx-trigger="every 3s"' in page
    assert "vendor/htmx/htmx.min.js" in page and "<script>" not in page


def test_a_share_of_a_gpu_and_the_limits_of_a_duration(
    people: dict[str, Any], live_controller: Any, settings: Any
) -> None:
    client = browser(people["member"])
    response = client.post(
        "/sessions/launch",
        _launch_data(client, **{"session-gpus": "", "session-gpu_fraction": "0.5"}),
    )
    assert response.status_code == 302
    assert JobRecord.objects.get().spec["gpu_milli"] == 500  # type: ignore[index]
    settings.SPUR_SESSION_MAX_MINUTES = 120
    response = client.post(
        "/sessions/launch", _launch_data(client, **{"session-max_minutes": "121"})
    )
    assert response.status_code == 200
    assert "At most 120 minutes." in response.content.decode()
    assert JobRecord.objects.count() == 1


def test_the_schedulers_refusal_is_shown_on_the_launcher(
    people: dict[str, Any], live_controller: Any
) -> None:
    client = browser(people["member"])
    response = client.post("/sessions/launch", _launch_data(client, **{"session-gpus": "4"}))
    assert response.status_code == 200
    assert b"Requested node configuration is not available" in response.content
    assert not JobRecord.objects.exists()


def test_a_billing_member_starts_no_session(people: dict[str, Any], live_controller: Any) -> None:
    client = browser(people["billing"])
    response = client.post("/sessions/launch", _launch_data(client))
    assert response.status_code == 200
    assert BILLING_ROLE_MESSAGE in response.content.decode().replace("&#x27;", "'")
    assert not JobRecord.objects.exists()


def test_nobody_signed_in_starts_or_sees_nothing(db: None) -> None:
    for response in (
        browser(None).post("/sessions/launch", {"session-template": "shell"}),
        browser(None).get("/sessions/5/"),
        browser(None).get("/sessions/5/status"),
        browser(None).post("/sessions/5/stop"),
    ):
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


# -- a session's page -----------------------------------------------------------------------


@pytest.mark.parametrize("who", EVERYONE)
def test_the_organisation_sees_its_session_and_an_outsider_does_not(
    who: str, people: dict[str, Any]
) -> None:
    _session(7)
    client = browser(people[who])
    for path in ("/sessions/7/", "/sessions/7/status"):
        response = client.get(path, headers=HTMX)
        assert response.status_code == (404 if who == "outsider" else 200)
    if who in ROLES:
        page = client.get("/sessions/7/").content.decode()
        assert 'data-phase="pending"' in page
        stop = 'action="/sessions/7/stop"' in page
        assert stop == (who in RUNNERS)  # billing runs, and stops, nothing


def test_a_batch_job_is_not_a_session(people: dict[str, Any]) -> None:
    record(8)
    assert browser(people["owner"]).get("/sessions/8/").status_code == 404


def test_the_status_says_starting_until_the_script_is_ready_then_running(
    people: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _session(9, state="RUNNING", nodes=["node01"], start_time=timezone.now())
    client = browser(people["member"])
    assert (
        'data-phase="starting"' in client.get("/sessions/9/status", headers=HTMX).content.decode()
    )
    monkeypatch.setattr(session_views, "job_output", lambda **kw: {"data": f"hi\n{READY_LINE}\n"})
    status = client.get("/sessions/9/status", headers=HTMX)
    assert 'data-phase="running"' in status.content.decode()
    assert status["Cache-Control"] == "no-store"


@pytest.mark.parametrize(
    ("state", "expected"), [("COMPLETING", "stopping"), ("CANCELLED", "ended")]
)
def test_stopping_and_ended(state: str, expected: str, people: dict[str, Any]) -> None:
    _session(10, state=state)
    page = browser(people["owner"]).get("/sessions/10/").content.decode()
    assert f'data-phase="{expected}"' in page
    assert 'action="/sessions/10/stop"' not in page  # nothing left to stop


@pytest.mark.parametrize(("started_min_ago", "warned"), [(55, True), (5, False)])
def test_the_page_warns_before_the_maximum_duration(
    started_min_ago: int, warned: bool, people: dict[str, Any]
) -> None:
    start = timezone.now() - timedelta(minutes=started_min_ago)
    _session(11, state="RUNNING", start_time=start, time_limit_min=60)
    page = browser(people["member"]).get("/sessions/11/status", headers=HTMX).content.decode()
    assert ('id="session-warning"' in page) == warned
    if warned:
        assert "ends in 4 minutes" in page or "ends in 5 minutes" in page


# -- Stop -----------------------------------------------------------------------------------


def test_stop_cancels_the_sessions_job(people: dict[str, Any], live_controller: Any) -> None:
    client = browser(people["member"])
    response = client.post("/sessions/launch", _launch_data(client))
    job_id = int(response["Location"].strip("/").rsplit("/", 1)[-1])
    stopped = client.post(f"/sessions/{job_id}/stop", follow=True)
    assert f"Session {job_id}: stopping." in stopped.content.decode()
    client = live_controller.client()
    try:
        # Placed on the node (whose agent is not there): it completes once its agent
        # says its processes are gone; a pending one would be CANCELLED at once.
        assert client.job(job_id)["state"] in ("COMPLETING", "CANCELLED")
    finally:
        client.close()


@pytest.mark.parametrize("who", ["billing", "outsider"])
def test_billing_and_outsiders_stop_nothing(who: str, people: dict[str, Any]) -> None:
    _session(12, state="RUNNING")
    response = browser(people[who]).post("/sessions/12/stop", follow=True)
    if who == "outsider":
        assert response.status_code == 404
    else:
        assert BILLING_ROLE_MESSAGE in response.content.decode().replace("&#x27;", "'")


# -- where sessions show ---------------------------------------------------------------------


@pytest.mark.parametrize("who", ROLES)
def test_the_dashboard_lists_active_sessions_and_the_job_page_links_to_its_session(
    who: str, people: dict[str, Any]
) -> None:
    _session(20, state="RUNNING", nodes=["node01"])
    _session(21, state="CANCELLED")
    record(22, state="RUNNING")  # a batch job
    JobRecord.objects.filter(job_id=22).update(qos="interactive")  # even in the QoS
    client = browser(people[who])
    page = client.get("/").content.decode()
    assert '<a href="/sessions/20/">Session 20</a>: shell, RUNNING on node01' in page
    assert "/sessions/21/" not in page and "/sessions/22/" not in page
    assert 'href="/sessions/20/"' in client.get("/jobs/20/").content.decode()
    assert "/sessions/22/" not in client.get("/jobs/22/").content.decode()


def test_xterm_is_served_from_this_site_with_its_licence() -> None:
    from django.contrib.staticfiles import finders

    for name in ("xterm.js", "xterm.css", "LICENSE"):
        assert finders.find(f"vendor/xterm/{name}"), name
    licence = Path(str(finders.find("vendor/xterm/LICENSE")))
    assert "The xterm.js authors" in licence.read_text()
