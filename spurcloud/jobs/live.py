"""Live job updates for the portal: each changed JobRecord goes to the Channels group of its
organisation, where the dashboard's websocket consumers listen."""

from __future__ import annotations

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
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(organization_group(record.organization_id), job_message(record))
