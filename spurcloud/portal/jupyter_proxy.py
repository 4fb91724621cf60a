"""A session's JupyterLab in the portal: `/sessions/<id>/jupyter/...`, HTTP and websockets,
relayed to the agent of the session's node (agents/service_proxy.py), which relays to the
Unix socket the service listens on inside the job's sandbox. No port of the job is open.

Who: the portal's signed-in user, in the organisation the portal shows, whom
`session_terminal.session_access` lets into the session's web service (its own user
only: the service's pages run the session's code in this origin; a billing member is
refused, another organisation's session is the same 404 as a missing one), of a template
with a web service, while it runs. The controller's service token (`service_grant`, 60
s, for the job's node) goes with each request to the agent; it is kept for the same user
until shortly before it expires, and asked again when the agent refuses it.

What goes through: the path under the prefix (no `.`/`..` segment), the query, the body
(at most MAX_BODY), and the headers less the hop-by-hop ones, `Authorization`, the
forwarding headers, and the portal's own cookies: the service (the tenant's code) must
never see the portal's session, which would let a member act as the admin who opened
their session. Back come the status, the body as it streams, and the headers less the
hop-by-hop ones and those that act on the whole site (`Clear-Site-Data`, HSTS); a cookie
the service sets is kept to the prefix, and one named as a portal cookie is dropped.

Requests that change something (not GET, HEAD, OPTIONS) must come from the portal's own
origin (the `Origin` header), as Django's CSRF check would require; websockets are
checked by the ASGI stack's origin validator (spurcloud/asgi.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import AsyncIterator
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, Any

import httpx
from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.contrib.sessions.backends.base import SessionBase
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from agents.service_proxy import MAX_BODY, TOKEN_HEADER, forwarded_headers, safe_path
from spurcloud.portal import timezones
from spurcloud.portal.consumers import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED
from spurcloud.portal.selection import selected_membership
from spurcloud.portal.session_activity import NOTE_EVERY_S, note_session_activity
from spurcloud.portal.session_terminal import TerminalUnavailable, service_grant, session_access
from spurcloud.portal.sessions import WEB_PREFIX, session_templates, template_key

if TYPE_CHECKING:
    from asgiref.sync import sync_to_async as database_sync_to_async
    from django.contrib.auth.models import User
else:
    from channels.db import database_sync_to_async

PREFIX = WEB_PREFIX
# Its pages (urls.py) and its websockets (routing.py): the same path, the job id as
# everywhere at most 18 digits; the rest is checked by `safe_path`.
PATH_PATTERN = r"^sessions/(?P<job_id>[0-9]{1,18})/jupyter/(?P<rest>.*)\Z"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_MESSAGE = 16 * 1024 * 1024
CLOSE_NOT_FOUND = 4404
CLOSE_UNAVAILABLE = 4503
CLOSE_BAD_PATH = 4400
GRANT_MARGIN_S = 15.0  # a grant is used until this long before it expires
_GRANTS_MAX = 4096
# Headers of the browser's request the service never sees (the proxy sets its own).
_REQUEST_DROP = (
    "authorization",
    "cookie",
    "host",
    "content-length",
    TOKEN_HEADER,
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
)
# Headers of the service's answer that would act on the whole portal.
_RESPONSE_DROP = ("set-cookie", "clear-site-data", "strict-transport-security", "content-length")
_WS_DROP = (
    *_REQUEST_DROP,
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
)


def session_used(job_id: int) -> None:
    """Each request and websocket message through the proxy calls this: the session is
    in use (idle culling, session_activity.py), noted at most every NOTE_EVERY_S per job
    by this process, so that a page's many requests do not each write the cache."""
    now = time.monotonic()
    if now - _noted.get(job_id, -math.inf) < NOTE_EVERY_S:
        return
    if len(_noted) >= 10_000:
        _noted.clear()  # bounded: ended sessions' entries go
    _noted[job_id] = now
    note_session_activity(job_id)


_noted: dict[int, float] = {}  # job id -> when this process last noted it (monotonic)


def portal_cookie_names() -> frozenset[str]:
    return frozenset(
        {
            settings.SESSION_COOKIE_NAME,
            settings.CSRF_COOKIE_NAME,
            settings.LANGUAGE_COOKIE_NAME,
            "messages",
            timezones.COOKIE,
        }
    )


def service_cookies(header: str) -> str:
    """The `Cookie` header for the service: the browser's, less the portal's cookies."""
    portal = portal_cookie_names()
    kept = []
    for part in header.split(";"):
        name = part.split("=", 1)[0].strip()
        if name and name not in portal:
            kept.append(part.strip())
    return "; ".join(kept)


def kept_cookies(set_cookies: list[str], prefix: str) -> SimpleCookie:
    """The service's Set-Cookie lines, each held to `prefix`, less the portal's names."""
    portal = portal_cookie_names()
    kept: SimpleCookie = SimpleCookie()
    for line in set_cookies:
        parsed: SimpleCookie = SimpleCookie()
        try:
            parsed.load(line)
        except CookieError:
            continue
        for name, morsel in parsed.items():
            if name in portal:
                continue
            if not str(morsel["path"]).startswith(prefix):
                morsel["path"] = prefix
            morsel["domain"] = ""
            kept[name] = morsel
    return kept


class _Grants:
    """Service tokens by (organisation, user, job) until shortly before they expire."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[tuple[int, int, int], dict[str, Any]] = {}

    def get(self, key: tuple[int, int, int]) -> dict[str, Any] | None:
        with self.lock:
            grant = self.held.get(key)
        if grant is None or float(grant["expires"]) - GRANT_MARGIN_S <= time.time():
            return None
        return grant

    def put(self, key: tuple[int, int, int], grant: dict[str, Any]) -> None:
        with self.lock:
            if len(self.held) >= _GRANTS_MAX:
                now = time.time()
                self.held = {k: g for k, g in self.held.items() if float(g["expires"]) > now}
                if len(self.held) >= _GRANTS_MAX:
                    self.held.clear()
            self.held[key] = grant

    def forget(self, key: tuple[int, int, int]) -> None:
        with self.lock:
            self.held.pop(key, None)


grants = _Grants()


def grant_for(
    *, user: User, session: SessionBase, job_id: int, fresh: bool = False
) -> dict[str, Any]:
    """The service grant for `user` in session `job_id`, after every check of who may."""
    membership = selected_membership(user=user, session=session)
    if membership is None:
        raise Http404("No organisation.")
    record = session_access(membership=membership, job_id=job_id, own_only=True)
    template = session_templates().get(template_key(record.spec) or "")
    if template is None or not template.web:
        raise Http404(f"Session {job_id} has no web service.")
    key = (membership.organization_id, membership.user_id, job_id)
    grant = None if fresh else grants.get(key)
    if grant is None:
        grant = service_grant(membership=membership, job_id=job_id)
        grants.put(key, grant)
    return grant


def _agent_url(grant: dict[str, Any], job_id: int, target: str) -> str:
    base = str(grant["agent_url"]).rstrip("/")
    return f"{base}/v1/jobs/{job_id}/service{PREFIX.format(job_id=job_id)}{target}"


def _same_origin(request: HttpRequest) -> bool:
    origin = request.headers.get("Origin", "")
    return bool(origin) and (
        origin == f"{request.scheme}://{request.get_host()}"
        or origin in settings.CSRF_TRUSTED_ORIGINS
    )


def _text(status: int, message: str) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain")


@csrf_exempt  # checked by origin below: the service's own XSRF token is not the portal's
async def jupyter_http(request: HttpRequest, job_id: str, rest: str) -> HttpResponseBase:
    user = await request.auser()
    if not user.is_authenticated:
        if request.method in SAFE_METHODS:
            return redirect_to_login(request.get_full_path())
        return _text(401, "Sign in first.")
    if request.method not in SAFE_METHODS and not _same_origin(request):
        return _text(403, "Cross-origin request refused.")
    target = safe_path(rest)
    if target is None:
        return _text(400, "Invalid path.")
    number = int(job_id)
    body = await sync_to_async(request.read)(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        return _text(413, f"The request body is over {MAX_BODY} bytes.")
    headers = forwarded_headers(request.headers.items(), drop=_REQUEST_DROP)
    cookies = service_cookies(request.headers.get("Cookie", ""))
    if cookies:
        headers.append(("cookie", cookies))
    headers += [
        ("x-forwarded-host", request.get_host()),
        ("x-forwarded-proto", request.scheme or "http"),
    ]
    query = request.META.get("QUERY_STRING", "")
    session_used(number)
    client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
    try:
        for fresh in (False, True):
            try:
                grant = await sync_to_async(grant_for)(
                    user=user, session=request.session, job_id=number, fresh=fresh
                )
            except TerminalUnavailable as exc:
                await client.aclose()
                return _text(503, exc.message)
            request_out = client.build_request(
                request.method or "GET",
                _agent_url(grant, number, target) + (f"?{query}" if query else ""),
                headers=[*headers, (TOKEN_HEADER, str(grant["token"]))],
                content=body,
            )
            upstream = await client.send(request_out, stream=True)
            if upstream.status_code != 401 or fresh:
                break
            await upstream.aclose()
    except (Http404, PermissionDenied):
        await client.aclose()
        raise
    except httpx.HTTPError as exc:
        await client.aclose()
        return _text(502, f"The session's node does not answer: {exc}")
    return _relay(upstream, client, PREFIX.format(job_id=number))


def _relay(upstream: httpx.Response, client: httpx.AsyncClient, prefix: str) -> HttpResponseBase:
    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()
            await client.aclose()

    response = StreamingHttpResponse(chunks(), status=upstream.status_code)
    del response["Content-Type"]
    for key, value in forwarded_headers(upstream.headers.multi_items(), drop=_RESPONSE_DROP):
        response[key] = value
    response.cookies = kept_cookies(upstream.headers.get_list("set-cookie"), prefix)
    return response


class JupyterProxyConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]  # Channels: no types
    """The websocket half: accepted once the agent (and the service) accepted it, with the
    subprotocol the service took; then each message is passed on as it came."""

    upstream: ClientConnection | None = None
    pump: asyncio.Task[None] | None = None
    job_id: int = 0

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        kwargs = self.scope["url_route"]["kwargs"]
        self.job_id = int(kwargs["job_id"])
        target = safe_path(str(kwargs["rest"]))
        if target is None:
            await self.close(code=CLOSE_BAD_PATH)
            return
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope["headers"]]
        headers = forwarded_headers(raw, drop=_WS_DROP)
        cookies = service_cookies(dict(raw).get("cookie", ""))
        if cookies:
            headers.append(("cookie", cookies))
        if "host" in dict(raw):
            headers.append(("x-forwarded-host", dict(raw)["host"]))
        query = self.scope.get("query_string", b"").decode("latin-1")
        for fresh in (False, True):
            try:
                grant = await database_sync_to_async(grant_for)(
                    user=user, session=self.scope["session"], job_id=self.job_id, fresh=fresh
                )
            except Http404:
                await self.close(code=CLOSE_NOT_FOUND)
                return
            except PermissionDenied:
                await self.close(code=CLOSE_FORBIDDEN)
                return
            except TerminalUnavailable:
                await self.close(code=CLOSE_UNAVAILABLE)
                return
            url = _agent_url(grant, self.job_id, target) + (f"?{query}" if query else "")
            try:
                self.upstream = await connect(
                    "ws" + url.removeprefix("http"),
                    additional_headers=[*headers, (TOKEN_HEADER, str(grant["token"]))],
                    subprotocols=self.scope.get("subprotocols") or None,
                    max_size=MAX_MESSAGE,
                    compression=None,
                    proxy=None,
                    open_timeout=15,
                )
                break
            except InvalidStatus as exc:
                if fresh or exc.response.status_code != 403:
                    await self.close(code=CLOSE_UNAVAILABLE)
                    return
            except (OSError, InvalidHandshake, TimeoutError):
                await self.close(code=CLOSE_UNAVAILABLE)
                return
        if self.upstream is None:
            await self.close(code=CLOSE_UNAVAILABLE)
            return
        await self.accept(subprotocol=self.upstream.subprotocol)
        session_used(self.job_id)
        self.pump = asyncio.create_task(self._down(self.upstream))

    async def _down(self, upstream: ClientConnection) -> None:
        try:
            async for message in upstream:
                session_used(self.job_id)
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                else:
                    await self.send(text_data=message)
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        await self.close(code=code if code not in (1005, 1006) else 1000)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.upstream is None:
            return
        session_used(self.job_id)
        with contextlib.suppress(ConnectionClosed):
            await self.upstream.send(bytes_data if bytes_data is not None else text_data or "")

    async def disconnect(self, code: int) -> None:
        if self.upstream is not None:
            await self.upstream.close()
        if self.pump is not None and self.pump is not asyncio.current_task():
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.pump
