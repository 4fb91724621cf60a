"""A job's output, live (`/ws/jobs/<id>/output/`): the tail of its stdout and stderr, then
each new piece as the job writes it, read from the agent of the job's first node through
the same selector as `GET /api/v1/jobs/{id}/output` (`jobs.selectors.job_output`).

Messages, JSON:
- `{"type": "state", "state": "RUNNING", "kind": "running", "reason": "", "exit": ""}`: the
  job's state as the page shows it (badge kind, reason, exit as sacct prints it), first
  and whenever it changes, so the page's facts stay current without a reload;
- `{"type": "output", "stream": "stdout", "offset": n, "data": "..."}`: the stream's
  bytes from `offset` (the first of a stream may start past 0: `skipped` says how much
  came before the tail, which the download link has whole);
- `{"type": "status", "text": "..."}`: why nothing comes now (not started, node
  unreachable); the consumer keeps trying;
- `{"type": "end", "state": "COMPLETED"}`: the job is over and every byte was sent.

The agent is polled (every `poll_interval_s`), one consumer per open page: an agent
serves a piece of a file from its spool, which costs a read. Refused at the handshake:
no signed-in user (4401), no organisation (4403), and a job that is missing or another
organisation's (4404, the same for both)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from agents.output import STREAMS
from spurcloud.jobs.errors import JobOutputUnavailable
from spurcloud.jobs.models import TERMINAL_STATES, JobRecord
from spurcloud.jobs.selectors import job_output
from spurcloud.portal.consumers import (
    CLOSE_FORBIDDEN,
    CLOSE_UNAUTHENTICATED,
    session_organization_id,
)
from spurcloud.portal.templatetags.jobs import exit_text, reason_text, state_kind
from spurcloud.tenants.models import Organization

if TYPE_CHECKING:
    from asgiref.sync import sync_to_async as database_sync_to_async
    from django.contrib.auth.models import User
else:
    from channels.db import database_sync_to_async

CLOSE_NOT_FOUND = 4404
TAIL_BYTES = 64 * 1024  # what a page shows at first of a long output
CHUNK_BYTES = 64 * 1024  # one read from the agent
CHUNKS_PER_POLL = 4  # a burst of output is sent over a few polls, not all at once


class JobOutputConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # Channels: no types
    poll_interval_s: float = 1.0
    organization: Organization | None = None
    job_id: int = 0
    follower: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        organization = await self._selected_organization(user)
        if organization is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        if not await self._job_exists(organization, self.job_id):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.organization = organization
        self.offsets: dict[str, int | None] = dict.fromkeys(STREAMS)
        self.last_status = ""
        self.last_state: dict[str, Any] = {}
        await self.accept()
        self.follower = asyncio.create_task(self._follow())

    async def disconnect(self, code: int) -> None:
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.follower

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the page only listens

    async def _follow(self) -> None:
        while not await self.poll_once():
            await asyncio.sleep(self.poll_interval_s)

    async def poll_once(self) -> bool:
        """Sends what is new; True once the job is over and all of it was sent."""
        facts = await self._state_message()
        if facts != self.last_state:
            self.last_state = facts
            await self.send_json(facts)
        over = facts["state"] in TERMINAL_STATES
        # Over once the history says so (its event may come after the agent saw the exit).
        done = over
        for stream in STREAMS:
            try:
                chunks, finished = await self._read(stream)
            except Http404 as exc:
                if over:  # ended before it ran: there is no output
                    await self.send_json({"type": "end", "state": facts["state"]})
                    return True
                await self._status(str(exc))
                return False
            except JobOutputUnavailable as exc:
                await self._status(exc.message)
                return False
            for message in chunks:
                await self.send_json(message)
            done = done and finished
        if self.last_status:
            await self._status("")
        if done:
            await self.send_json({"type": "end", "state": facts["state"]})
        return done

    async def _status(self, text: str) -> None:
        if text != self.last_status:
            self.last_status = text
            await self.send_json({"type": "status", "text": text})

    @database_sync_to_async
    def _read(self, stream: str) -> tuple[list[dict[str, Any]], bool]:
        """The stream's new pieces as messages, and whether it is complete (the job is
        over and nothing is left to send)."""
        assert self.organization is not None

        def read(offset: int, limit: int) -> dict[str, Any]:
            assert self.organization is not None
            return job_output(
                organization=self.organization,
                job_id=self.job_id,
                stream=stream,
                offset=offset,
                limit=limit,
            )

        messages: list[dict[str, Any]] = []
        offset = self.offsets[stream]
        skipped = 0
        if offset is None:  # the first read: start at the tail
            size = int(read(0, 1)["size"])
            offset = skipped = max(0, size - TAIL_BYTES)
        for _ in range(CHUNKS_PER_POLL):
            chunk = read(offset, CHUNK_BYTES)
            next_offset = int(chunk["next_offset"])
            if next_offset > offset or skipped:
                message = {"type": "output", "stream": stream, "offset": offset}
                message["data"] = str(chunk["data"])
                if skipped:
                    message["skipped"], skipped = skipped, 0
                messages.append(message)
            moved, offset = next_offset > offset, next_offset
            if not moved or offset >= int(chunk["size"]):
                break
        self.offsets[stream] = offset
        return messages, not chunk["running"] and offset >= int(chunk["size"])

    @database_sync_to_async
    def _state_message(self) -> dict[str, Any]:
        row = (
            JobRecord.objects.filter(organization=self.organization, job_id=self.job_id)
            .values("state", "reason", "exit_code", "signal")
            .first()
        )
        job: dict[str, object] = dict(row) if row else {"state": ""}
        state = str(job["state"])
        return {
            "type": "state",
            "state": state,
            "kind": state_kind(state),
            "reason": reason_text(str(job.get("reason") or "")),
            "exit": exit_text(job),
        }

    @database_sync_to_async
    def _selected_organization(self, user: User) -> Organization | None:
        organization_id = session_organization_id(self.scope, user)
        if organization_id is None:
            return None
        return Organization.objects.get(pk=organization_id)

    @database_sync_to_async
    def _job_exists(self, organization: Organization, job_id: int) -> bool:
        return JobRecord.objects.filter(organization=organization, job_id=job_id).exists()
