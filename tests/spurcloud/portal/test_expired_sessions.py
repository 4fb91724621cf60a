"""A signed-out browser's websocket: a session cookie whose Django session has expired is
nobody's, at the handshake of every consumer (the live job table, a job's output, a
session's terminal, its JupyterLab through the proxy), as no cookie at all is (4401).
The same socket with the person's live session gets past that check."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from spurcloud.asgi import application
from spurcloud.jobs.models import JobRecord
from tests.spurcloud.portal.conftest import record
from tests.spurcloud.websocket import WebsocketClient

# The consumers' database_sync_to_async closes connections around each call: commit.
pytestmark = pytest.mark.django_db(transaction=True)

# Each consumer's path, and what the person's live session gets there: accepted (the
# terminal then says the session does not run), or, at the proxy, the 4404 of a session
# without a web service (a shell's).
PATHS = {
    "jobs table": ("/ws/jobs/", (True, None)),
    "job output": ("/ws/jobs/{job}/output/", (True, None)),
    "terminal": ("/ws/sessions/{job}/terminal/", (True, None)),
    "jupyter proxy": ("/sessions/{job}/jupyter/api/events/subscribe", (False, 4404)),
}


def _cookie(user: Any) -> str:
    browser = Client()
    browser.force_login(user)
    return str(browser.cookies["sessionid"].value)


def _connect(path: str, cookie: str) -> tuple[bool, Any]:
    headers = [
        (b"origin", b"http://localhost"),
        (b"host", b"localhost"),
        (b"cookie", f"sessionid={cookie}".encode()),
    ]
    socket = WebsocketClient(application, path, headers=headers)

    async def scenario() -> tuple[bool, Any]:
        answer = await socket.connect(timeout=15)
        if answer[0]:
            await socket.disconnect()
        return answer

    return async_to_sync(scenario)()


@pytest.mark.parametrize("consumer", list(PATHS))
def test_an_expired_session_is_turned_away_as_nobody(
    consumer: str, people: dict[str, Any], settings: Any
) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    record(7, state="PENDING")  # the member's session
    JobRecord.objects.filter(job_id=7).update(
        spec={"qos": "interactive", "comment": "spur-session:shell"}, qos="interactive"
    )
    path, answer = PATHS[consumer][0].format(job=7), PATHS[consumer][1]
    live, expired = _cookie(people["member"]), _cookie(people["member"])
    Session.objects.filter(session_key=expired).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    assert _connect(path, expired) == (False, 4401)
    assert _connect(path, live) == answer
