"""Times in the viewer's time zone, with the zone said: the browser's zone comes in the
`spur_tz` cookie (static/js/portal.js), for the pages and the live table's rows alike."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from spurcloud.asgi import application
from spurcloud.jobs.tasks import job_events
from spurcloud.portal.timezones import zone_named
from tests.spurcloud.conftest import Tenant, event, job_dict
from tests.spurcloud.portal.conftest import browser, record
from tests.spurcloud.websocket import WebsocketClient

SUBMIT = 1_764_576_005.0  # 2025-12-01 08:00:05 UTC


@pytest.mark.parametrize(
    "name", ["", "UTC+1", "../../etc/passwd", "Europe/Paris" * 10, "Mars/Olympus_Mons", None]
)
def test_only_a_zone_of_the_zoneinfo_database_is_taken(name: str | None) -> None:
    assert zone_named(name) is None


def test_a_known_zone_is_taken() -> None:
    zone = zone_named("America/New_York")
    assert zone is not None and str(zone) == "America/New_York"


def test_the_job_list_shows_times_in_the_viewers_zone(acme: Tenant) -> None:
    record(5, submit_time=SUBMIT)
    client = browser(acme.member)
    assert '<td data-field="submit_time">2025-12-01 08:00:05 UTC</td>' in (
        client.get("/jobs/").content.decode()
    )
    client.cookies["spur_tz"] = "Asia/Tokyo"
    assert '<td data-field="submit_time">2025-12-01 17:00:05 JST</td>' in (
        client.get("/jobs/").content.decode()
    )


@pytest.mark.django_db(transaction=True)
def test_a_live_row_is_in_the_zone_of_the_page_it_updates(acme: Tenant, settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.SPUR_JOBS_POLL_INTERVAL_S = 0
    client = Client()
    client.force_login(acme.member)
    cookie = f"sessionid={client.cookies['sessionid'].value}; spur_tz=Asia/Tokyo"
    socket = WebsocketClient(
        application,
        "/ws/jobs/",
        headers=[(b"origin", b"http://localhost"), (b"cookie", cookie.encode())],
    )
    changed = event(job_dict(6, tenant="acme", user="max", submit_time=SUBMIT))

    async def scenario() -> None:
        assert (await socket.connect())[0]
        await sync_to_async(job_events)([changed])
        message = await socket.receive_json_from()
        assert '<td data-field="submit_time">2025-12-01 17:00:05 JST</td>' in message["row"]
        await socket.disconnect()

    async_to_sync(scenario)()
