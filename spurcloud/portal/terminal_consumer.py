"""A session's web terminal (`/ws/sessions/<id>/terminal/`): the browser's xterm.js on one
side, the PTY the session's agent opens in the job (agents/terminal.py) on the other.

On connect the consumer asks `terminal_grant` (session_terminal.py: the session's user,
an owner or an admin; the controller's 60-second token for the session's node), opens
the agent's websocket with that token, and then relays: binary frames are the
terminal's bytes both ways; a text frame from the browser is a control message, of which
only a resize (`{"resize": [cols, rows]}`, checked here) goes on to the agent. Each
reconnection (a reload, another tab) is a new grant and a new shell; a job holds a few at
most (the agent's MAX_TERMINALS_PER_JOB).

Refused at the handshake: no signed-in user (4401), no organisation or a billing member
or a member's terminal in another's session (4403), a job that is missing, another
organisation's or no session (4404, the same for each). Accepted and then closed, with
a `{"type": "status", "text": ...}` message that says why first: the session is not
running or the scheduler unreachable (4409), its node unreachable (4503), the node
refused the token (4401, relayed), too many terminals (4429), the shell exited (1000).
Terminal use is the session's activity for idle culling (session_activity.py).

With the agent's socket comes the shell's API token, for the Slurm commands in it
(terminal_api_token.py): minted for this connection, sent in `X-Spur-Api-Token` with the
web's URL in `X-Spur-Api-Url`, revoked when the connection ends however it ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.exceptions import PermissionDenied
from django.http import Http404
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from agents.terminal import API_TOKEN_HEADER, API_URL_HEADER, MAX_FRAME, parse_control
from spurcloud.portal.consumers import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED
from spurcloud.portal.selection import selected_membership
from spurcloud.portal.session_activity import NOTE_EVERY_S, note_session_activity
from spurcloud.portal.session_terminal import TerminalUnavailable, terminal_grant
from spurcloud.portal.terminal_api_token import (
    api_url_for_nodes,
    mint_terminal_token,
    revoke_terminal_token,
)
from spurcloud.tenants.models import ApiToken, Membership

if TYPE_CHECKING:
    from asgiref.sync import sync_to_async as database_sync_to_async
    from django.contrib.auth.models import User
else:
    from channels.db import database_sync_to_async

CLOSE_NOT_FOUND = 4404
CLOSE_NOT_RUNNING = 4409
CLOSE_NODE_UNREACHABLE = 4503
CLOSE_TOO_BIG = 1009
AGENT_OPEN_TIMEOUT_S = 10.0
# The agent's codes a browser is told as they are; anything else reads as the node's.
_RELAYED = {1000, 4401, 4429, 4503}


def agent_terminal_url(agent_url: str, job_id: int) -> str:
    """The agent's terminal websocket, from its HTTP URL as the node registered it."""
    parts = urlsplit(agent_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise InvalidURI(agent_url, "not an http(s) URL")
    path = f"{parts.path.rstrip('/')}/v1/jobs/{int(job_id)}/terminal"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


class SessionTerminalConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]  # Channels: no types
    agent: ClientConnection | None = None
    relay: asyncio.Task[None] | None = None
    job_id: int = 0
    noted_at: float = 0.0
    api_token: ApiToken | None = None  # the shell's, for this connection

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        try:
            membership = await self._membership(user)
            grant = await self._grant(membership)
        except PermissionDenied:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        except Http404:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        except TerminalUnavailable as exc:
            await self._refuse(CLOSE_NOT_RUNNING, exc.message)
            return
        headers = {"Authorization": f"Bearer {grant['token']}"}
        minted = await self._mint(membership)
        if minted is not None:
            self.api_token, headers[API_TOKEN_HEADER] = minted
            url = api_url_for_nodes(self.scope)
            if url:
                headers[API_URL_HEADER] = url
        try:
            self.agent = await connect(
                agent_terminal_url(str(grant.get("agent_url") or ""), self.job_id),
                additional_headers=headers,
                open_timeout=AGENT_OPEN_TIMEOUT_S,
                max_size=MAX_FRAME * 4,
                compression=None,
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            await self._revoke()
            await self._refuse(
                CLOSE_NODE_UNREACHABLE,
                f"Node {grant.get('node')}, where session {self.job_id} runs, is unreachable "
                f"({type(exc).__name__}).",
            )
            return
        await self.accept()
        await self._note()
        self.relay = asyncio.create_task(self._from_agent())

    async def disconnect(self, code: int) -> None:
        if self.relay is not None:
            self.relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.relay
        if self.agent is not None:
            await self.agent.close()  # the agent kills the shell
        await self._revoke()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.agent is None:
            return
        if len(bytes_data or b"") > MAX_FRAME or len(text_data or "") > MAX_FRAME:
            await self.close(code=CLOSE_TOO_BIG)
            return
        with contextlib.suppress(ConnectionClosed):  # the relay task reports the close
            if bytes_data:
                await self.agent.send(bytes_data)
                await self._note()
            elif text_data is not None:
                size = parse_control(text_data)
                if size is not None:
                    await self.agent.send(json.dumps({"resize": list(size)}))

    async def _from_agent(self) -> None:
        assert self.agent is not None
        try:
            async for message in self.agent:
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                    await self._note()
        except ConnectionClosed:
            pass
        code = self.agent.close_code or CLOSE_NODE_UNREACHABLE
        reason = self.agent.close_reason or ""
        if code not in _RELAYED:
            code, reason = CLOSE_NODE_UNREACHABLE, f"the node closed the terminal ({code})"
        await self._revoke()  # the shell is gone
        await self._refuse(code, reason or "The terminal closed.", accepted=True)

    async def _refuse(self, code: int, text: str, *, accepted: bool = False) -> None:
        """Say why in a message the page shows, then close with `code`."""
        if not accepted:
            await self.accept()
        await self.send(text_data=json.dumps({"type": "status", "text": text}))
        await self.close(code=code)

    async def _note(self) -> None:
        now = time.monotonic()
        if now - self.noted_at >= NOTE_EVERY_S:
            self.noted_at = now
            await database_sync_to_async(note_session_activity)(self.job_id)

    async def _revoke(self) -> None:
        token, self.api_token = self.api_token, None
        if token is not None:
            await database_sync_to_async(revoke_terminal_token)(token)

    @database_sync_to_async
    def _membership(self, user: User) -> Membership:
        session = self.scope.get("session")
        membership = selected_membership(user=user, session=session) if session else None
        if membership is None:
            raise PermissionDenied("You belong to no organisation.")
        return membership

    @database_sync_to_async
    def _grant(self, membership: Membership) -> dict[str, Any]:
        return terminal_grant(membership=membership, job_id=self.job_id)

    @database_sync_to_async
    def _mint(self, membership: Membership) -> tuple[ApiToken, str] | None:
        return mint_terminal_token(membership=membership, job_id=self.job_id)
