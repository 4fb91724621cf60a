"""Live job updates for the portal: each changed JobRecord goes to the Channels group of its
organisation, where the dashboard's websocket consumers listen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from spurcloud.jobs import jobobject
from spurcloud.jobs.models import JobRecord

MESSAGE_TYPE = "job.update"  # handled by JobsConsumer.job_update


def organization_group(organization_id: int) -> str:
    return f"org-{organization_id}"


def job_message(record: JobRecord) -> dict[str, Any]:
    return {
        "type": MESSAGE_TYPE,
        "job": jobobject.from_record(record, tenant=record.organization.slug),
    }


def push_job(record: JobRecord) -> None:
    """Sends the record to its organisation's group. With the in-memory layer this reaches
    only consumers in this process; the consumers poll instead (see settings)."""
    push_jobs([record])


def push_jobs(records: Sequence[JobRecord]) -> None:
    """`push_job` for each record, in order, in one pass through an event loop: from a
    worker's thread each `async_to_sync` starts a thread and a loop of its own, which cost
    more than the send (an event batch pushed its jobs one by one)."""
    layer = get_channel_layer()
    if layer is None or not records:
        return
    messages = [(organization_group(r.organization_id), job_message(r)) for r in records]

    async def send_all() -> None:
        for group, message in messages:
            await layer.group_send(group, message)

    async_to_sync(send_all)()
