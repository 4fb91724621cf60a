"""The dashboard's websocket (`/ws/jobs/`): job objects of the selected organisation as they
change, one JSON message `{"type": "job", "job": {...}, "row": "<tr>..."}` each. `row` is
the table row rendered by the same template as the page (portal/_job_row.html), so the
browser shows a change exactly as a reload would, with no formatting of its own.

Two ways to hear of changes, chosen by settings:
- a Redis Channels layer: the `spur.job_events` task (in a worker) group_sends each changed
  job to `org-<id>`, and this consumer relays it;
- the in-memory layer (the embedded default): a layer lives inside one process, so the
  worker's group_send cannot reach this one. The organisation's feed (portal/job_feed.py),
  one per organisation and process, polls JobRecord every SPUR_JOBS_POLL_INTERVAL_S for
  rows whose last_seq is above the newest it has sent (seq grows with every controller
  event, so this sees every change once) and sends them to the group, as a worker would.
  In-process senders (act_on_job in this web process, tests) reach the group directly.
"""

from __future__ import annotations

from datetime import UTC, tzinfo
from typing import TYPE_CHECKING, Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from spurcloud.jobs.live import organization_group
from spurcloud.jobs.models import JobRecord
from spurcloud.portal.job_feed import join_feed, leave_feed
from spurcloud.portal.job_rows import job_row
from spurcloud.portal.selection import selected_membership
from spurcloud.portal.timezones import zone_of_cookies

if TYPE_CHECKING:
    # Channels ships no types. Its database_sync_to_async is asgiref's SyncToAsync (that
    # also closes stale database connections around the call), so it is checked as that.
    from asgiref.sync import sync_to_async as database_sync_to_async
    from django.contrib.auth.models import User
else:
    from channels.db import database_sync_to_async

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def job_message(job: dict[str, Any], zone: tzinfo | None = None) -> dict[str, Any]:
    """The message of one changed job; its row's times in the viewer's `zone` (as the
    page that holds the table shows them), UTC when it is not known."""
    with timezone.override(zone or UTC):
        row = job_row(job)
    return {"type": "job", "job": job, "row": str(row)}


def session_organization_id(scope: dict[str, Any], user: User) -> int | None:
    """The organisation the browser's session has selected, if the user still belongs to
    it (else their first, as on the pages); None when they belong to none."""
    session = scope.get("session")
    if session is None:
        return None
    membership = selected_membership(user=user, session=session)
    return membership.organization_id if membership else None


class JobsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # Channels: no types
    organization_id: int | None = None
    group: str = ""
    sent_seq: int = 0
    feeding: bool = False
    zone: tzinfo | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        organization_id = await self._selected_organization_id(user)
        if organization_id is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.organization_id = organization_id
        self.zone = zone_of_cookies(self.scope.get("cookies") or {})
        self.group = organization_group(organization_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        interval = float(settings.SPUR_JOBS_POLL_INTERVAL_S)
        if interval > 0:
            self.sent_seq = await self._highest_seq(organization_id)
            join_feed(organization_id, interval=interval, since=self.sent_seq)
            self.feeding = True
        await self.accept()  # listening: every change from now on reaches it

    async def disconnect(self, code: int) -> None:
        if self.feeding:
            self.feeding = False
            assert self.organization_id is not None
            await leave_feed(self.organization_id)
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the dashboard only listens

    async def job_update(self, message: dict[str, Any]) -> None:
        job = message["job"]
        seq = int(job.get("seq") or 0)
        if seq and seq <= self.sent_seq:
            return  # the poll already sent this change (or a newer one)
        self.sent_seq = max(self.sent_seq, seq)
        await self.send_json(job_message(job, self.zone))

    @database_sync_to_async
    def _selected_organization_id(self, user: User) -> int | None:
        return session_organization_id(self.scope, user)

    @database_sync_to_async
    def _highest_seq(self, organization_id: int) -> int:
        top = JobRecord.objects.filter(organization_id=organization_id).aggregate(
            top=Max("last_seq")
        )["top"]
        return int(top or 0)
