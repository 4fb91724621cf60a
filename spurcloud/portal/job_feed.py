"""The jobs table polled once per organisation and web process, for every socket of that
organisation the process holds (the in-memory channel layer's way to hear changes).

A worker records the controller's job events in another process; with the in-memory
layer its group_send never reaches the web process, so the dashboard's sockets learn of
changes from the table (rows whose `last_seq` grew). Each socket polling for itself cost
a query a second per open page: 100 browsers on one organisation, 100 queries a second
and a tenth of a core, for the same answer. Here the first socket of an organisation
starts one poll, the others join it, and the last to leave stops it; each change found
is sent once to the organisation's group, which every socket of this process has joined,
as a worker's push would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer

from spurcloud.jobs import jobobject
from spurcloud.jobs.live import MESSAGE_TYPE, organization_group
from spurcloud.jobs.selectors import jobs_changed_since

if TYPE_CHECKING:
    from asgiref.sync import sync_to_async as database_sync_to_async
else:
    from channels.db import database_sync_to_async

log = logging.getLogger(__name__)


@dataclass
class OrganizationFeed:
    organization_id: int
    interval: float
    seq: int  # changes after this one are sent to the group
    sockets: int = 0
    task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.poll_once()
            except Exception:  # a database hiccup must not end every socket's feed
                log.exception("polling the jobs of organisation %s", self.organization_id)

    async def poll_once(self) -> None:
        layer = get_channel_layer()
        group = organization_group(self.organization_id)
        for job in await _changed_jobs(self.organization_id, self.seq):
            self.seq = max(self.seq, int(job["seq"]))
            await layer.group_send(group, {"type": MESSAGE_TYPE, "job": job})


# The feeds of each event loop (a server has one; tests start several).
_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, OrganizationFeed]] = (
    weakref.WeakKeyDictionary()
)


def join_feed(organization_id: int, *, interval: float, since: int) -> None:
    """Joins the organisation's feed, or starts it with the changes after `since`. The
    socket has joined the group and then read `since` (the newest change): whatever the
    feed finds after that reaches it; what it sent before was older (the socket's
    `job_update` drops a change it has seen)."""
    feeds = _feeds.setdefault(asyncio.get_running_loop(), {})
    feed = feeds.get(organization_id)
    if feed is None:
        feed = feeds[organization_id] = OrganizationFeed(organization_id, interval, since)
        feed.task = asyncio.create_task(feed.run())
    feed.sockets += 1


async def leave_feed(organization_id: int) -> None:
    feeds = _feeds.get(asyncio.get_running_loop(), {})
    feed = feeds.get(organization_id)
    if feed is None:
        return
    feed.sockets -= 1
    if feed.sockets > 0:
        return
    del feeds[organization_id]
    if feed.task is not None:
        feed.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feed.task


@database_sync_to_async
def _changed_jobs(organization_id: int, seq: int) -> list[dict[str, Any]]:
    return [
        jobobject.from_record(r, tenant=r.organization.slug)
        for r in jobs_changed_since(organization_id=organization_id, seq=seq)
    ]


def sockets_fed(organization_id: int) -> int:
    """How many sockets of the running event loop share the organisation's feed (0: none
    runs)."""
    feed = _feeds.get(asyncio.get_running_loop(), {}).get(organization_id)
    return feed.sockets if feed is not None else 0
