"""The dashboard's websocket: members of the selected organisation hear its job changes;
nobody else does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from spurcloud.asgi import application
from spurcloud.jobs.services import record_job_event
from spurcloud.jobs.tasks import job_events
from spurcloud.portal.job_feed import sockets_fed
from tests.spurcloud.conftest import Tenant, event, job_dict, make_user
from tests.spurcloud.websocket import WebsocketClient

# The consumer's database_sync_to_async closes connections around each call, which would
# close the test's own transaction: these tests commit for real.
pytestmark = pytest.mark.django_db(transaction=True)

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def pushed(settings: Any) -> None:
    """Pushes through the channel layer (as with Redis), no polling."""
    settings.CHANNEL_LAYERS = IN_MEMORY
    settings.SPUR_JOBS_POLL_INTERVAL_S = 0


def _headers(user: Any | None) -> list[tuple[bytes, bytes]]:
    """A browser's handshake headers: its origin, and the session cookie of `user`."""
    headers = [(b"origin", b"http://localhost")]
    if user is not None:
        browser = Client()
        browser.force_login(user)
        headers.append((b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode()))
    return headers


def _socket(headers: list[tuple[bytes, bytes]]) -> WebsocketClient:
    return WebsocketClient(application, "/ws/jobs/", headers=headers)


def _acme_event(job_id: int, **changes: Any) -> dict[str, Any]:
    return event(job_dict(job_id, tenant="acme", user="max", **changes))


@pytest.mark.parametrize("who", ["owner", "member"])
def test_a_member_hears_each_change_of_the_organisations_jobs(
    who: str, acme: Tenant, pushed: None
) -> None:
    headers = _headers(getattr(acme, who))

    async def scenario() -> None:
        socket = _socket(headers)
        connected, _ = await socket.connect()
        assert connected
        await sync_to_async(job_events)([_acme_event(11, state="RUNNING")])
        message = await socket.receive_json_from(timeout=5)
        assert message["type"] == "job"
        assert (message["job"]["job_id"], message["job"]["state"]) == (11, "RUNNING")
        assert message["job"]["tenant"] == "acme"
        # The row as the page renders it: the browser formats nothing itself.
        assert message["row"].startswith('<tr data-job-id="11"')
        assert 'class="state state-running">RUNNING<' in message["row"]
        await socket.disconnect()

    async_to_sync(scenario)()


def test_a_member_of_another_organisation_hears_nothing(
    acme: Tenant, globex: Tenant, pushed: None
) -> None:
    headers = _headers(globex.member)

    async def scenario() -> None:
        socket = _socket(headers)
        connected, _ = await socket.connect()
        assert connected  # to its own organisation's jobs
        await sync_to_async(job_events)([_acme_event(12)])
        assert await socket.receive_nothing(timeout=0.3)
        await socket.disconnect()

    async_to_sync(scenario)()


def test_someone_in_no_organisation_is_turned_away(db: None, pushed: None) -> None:
    headers = _headers(make_user("lone"))

    async def scenario() -> None:
        connected, code = await _socket(headers).connect()
        assert (connected, code) == (False, 4403)

    async_to_sync(scenario)()


def test_an_anonymous_visitor_is_turned_away(db: None, pushed: None) -> None:
    headers = _headers(None)

    async def scenario() -> None:
        connected, code = await _socket(headers).connect()
        assert (connected, code) == (False, 4401)

    async_to_sync(scenario)()


def test_with_the_in_memory_layer_the_consumer_polls_for_changes(
    acme: Tenant, settings: Any
) -> None:
    settings.CHANNEL_LAYERS = IN_MEMORY
    settings.SPUR_JOBS_POLL_INTERVAL_S = 0.05
    record_job_event(event=_acme_event(1))  # before connecting: not sent again

    headers = _headers(acme.member)

    async def scenario() -> None:
        socket = _socket(headers)
        connected, _ = await socket.connect()
        assert connected
        # Recorded without any push, as a worker in another process would.
        await sync_to_async(record_job_event)(event=_acme_event(2, state="RUNNING"))
        message = await socket.receive_json_from(timeout=5)
        assert (message["job"]["job_id"], message["job"]["state"]) == (2, "RUNNING")
        await asyncio.sleep(0.2)
        assert await socket.receive_nothing(timeout=0.2)  # each change once
        await socket.disconnect()

    async_to_sync(scenario)()


def test_the_sockets_of_an_organisation_share_one_poll(
    acme: Tenant, globex: Tenant, settings: Any
) -> None:
    settings.CHANNEL_LAYERS = IN_MEMORY
    settings.SPUR_JOBS_POLL_INTERVAL_S = 0.05
    acme_id, globex_id = acme.organization.pk, globex.organization.pk
    browsers = [_headers(acme.member), _headers(acme.owner), _headers(globex.member)]

    async def scenario() -> None:
        member, owner, outsider = sockets = [_socket(headers) for headers in browsers]
        for socket in sockets:
            assert (await socket.connect())[0]
        assert (sockets_fed(acme_id), sockets_fed(globex_id)) == (2, 1)
        # Recorded as a worker in another process would: both hear it, once each.
        await sync_to_async(record_job_event)(event=_acme_event(3, state="RUNNING"))
        for socket in (member, owner):
            message = await socket.receive_json_from(timeout=5)
            assert (message["job"]["job_id"], message["job"]["state"]) == (3, "RUNNING")
        await asyncio.sleep(0.2)
        for socket in sockets:
            assert await socket.receive_nothing(timeout=0.1)
        # One leaves; the other still hears; the last to leave stops the poll.
        await member.disconnect()
        assert sockets_fed(acme_id) == 1
        await sync_to_async(record_job_event)(event=_acme_event(3, state="COMPLETED"))
        message = await owner.receive_json_from(timeout=5)
        assert message["job"]["state"] == "COMPLETED"
        await owner.disconnect()
        await outsider.disconnect()
        assert (sockets_fed(acme_id), sockets_fed(globex_id)) == (0, 0)

    async_to_sync(scenario)()
