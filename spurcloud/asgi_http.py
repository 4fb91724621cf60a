"""How the web serves HTTP under ASGI: each request's Django code (middleware, view,
template) in one hop to a thread, on a thread kept from one request to the next.

Django's own ASGI handler runs the middleware chain on the event loop. Its middleware
(sessions, CSRF, authentication, messages, security headers: `MiddlewareMixin`) run each
hook, `process_request` and `process_response` alike, through `sync_to_async`: about
fifteen hops between the loop and a thread for every page, each a future, a context copy
and two wake-ups, before the view's own. Under eight concurrent clients on two cores that
was a third of a page's cost. `SyncChainASGIHandler` builds the chain for sync code, as a
WSGI server runs it, and enters it in one hop: the request's body is still read and its
response still sent on the event loop, streaming responses (async iterators: a job's
output, the Jupyter proxy) stream from there, and async views run on the loop through
`async_to_sync` from the request's thread, as Django runs them under WSGI.

That thread was made for each request and dropped after it (asgiref's
`ThreadSensitiveContext`), and a database connection belongs to a thread: every page
opened a connection and closed it, whatever `CONN_MAX_AGE` said (SQLite: a file open and
its PRAGMAs; PostgreSQL: a TCP connection, its authentication and a server process).
`ReusedRequestThreads` still gives each request a thread of its own, taken from those
idle and put back after it, so a thread's connection serves the next request as under a
WSGI server's thread pool; Django's `close_old_connections`, at each request's start and
end, still closes one that is too old or broken. Concurrency is not limited: a request
that finds no idle thread gets a new one, and at most `idle_max` wait for the next (each
with its connection: on PostgreSQL up to 16 idle connections a web process, as a WSGI
server of 16 threads keeps).

A request to the tenant API's operations with a bearer token (`token_api_request`)
takes a shorter chain (`TokenApiHandler`): MIDDLEWARE without those a browser alone needs
(settings.BROWSER_ONLY_MIDDLEWARE: sessions, CSRF, messages, the viewer's time zone,
allauth, htmx, static files). They made a session, a message store and an allauth
context that the token's request never reads: about 4% of the web's CPU a submission
(bench/submit_cpu.py). The test client takes the same chain for the same requests
(tests/spurcloud/conftest.py, `TokenApiClient`), so that the API's tests run through
what the server runs.

`AccessLog` writes uvicorn's access log lines itself (uvicorn's own is off: `spurcloud
web`), in the same words, each by one write: through `logging` (a record, the caller's
frame looked up, uvicorn's formatter and its status phrase, a lock and a flush) a line
cost a sixth of a submission's CPU in the web.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import IO, Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.cache import caches
from django.core.exceptions import MiddlewareNotUsed, RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.db import connections
from django.http import FileResponse, HttpRequest, HttpResponseBase
from django.urls import set_script_prefix
from django.utils.module_loading import import_string

# The tenant API's operations: every view there is DRF's, authenticated by a token, and
# answers JSON (not /api/docs/, a page whose template reads the session).
TOKEN_API_PREFIX = "/api/v1/"


def token_api_request(request: HttpRequest) -> bool:
    """Whether `request` is an API operation's with a bearer token, which needs none of
    the browser's middleware (settings.BROWSER_ONLY_MIDDLEWARE)."""
    return (
        request.path_info.startswith(TOKEN_API_PREFIX)
        and request.META.get("HTTP_AUTHORIZATION", "")[:7].lower() == "bearer "
    )


class TokenApiHandler(base.BaseHandler):
    """The sync middleware chain of `token_api_request`s: settings.MIDDLEWARE without
    BROWSER_ONLY_MIDDLEWARE, in its order, built as Django's `load_middleware` builds a
    sync chain (the view, exception and template-response hooks of those it keeps)."""

    def __init__(self) -> None:
        super().__init__()
        self.load_middleware()

    def load_middleware(self, is_async: bool = False) -> None:
        assert not is_async, "the web runs its chains sync"
        # Django's own attributes, which _get_response reads (its stubs leave them out).
        self._view_middleware: list[Callable[..., Any]] = []
        self._template_response_middleware: list[Callable[..., Any]] = []
        self._exception_middleware: list[Callable[..., Any]] = []
        handler = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]
        skipped = settings.BROWSER_ONLY_MIDDLEWARE
        for path in reversed([p for p in settings.MIDDLEWARE if p not in skipped]):
            try:
                instance = import_string(path)(handler)
            except MiddlewareNotUsed:
                continue
            if hasattr(instance, "process_view"):
                self._view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_template_response"):
                self._template_response_middleware.append(instance.process_template_response)
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler


class SyncChainASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        base.BaseHandler.__init__(self)  # not ASGIHandler's: it loads the async chain
        self.load_middleware(is_async=False)
        self.token_api = TokenApiHandler()
        # Made once: its making (checks that `respond` is sync, copies its name) is the
        # same for every request, and it keeps no request's state.
        self.respond_in_thread = sync_to_async(self.respond)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = await sync_to_async(self.get_response)(request)
        return response

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's `ASGIHandler.handle`, with the request's Django work in one hop to its
        thread: `request_started`, the request, the middleware and view, and (an answer
        already made) its close and `request_finished`. Django's own made three hops of
        it, and ran two tasks on the loop to notice a client leaving while the view ran,
        which a view in a thread cannot be stopped for anyway. A streamed answer (a job's
        output followed) is still sent beside that watch, and stops when the client
        leaves, then closes in its thread, as Django does."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            response = await self.respond_in_thread(scope, body_file)
            if response.streaming:
                await self.stream(response, receive, send)
            else:
                await self.send_response(response, send)
        finally:
            body_file.close()

    def respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """The answer to the request, in its thread, closed unless it streams."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None  # Django's 400 or 413
            response: HttpResponseBase = error_response
        else:
            handler = self.token_api if token_api_request(request) else self
            response = handler.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # its content is made: request_finished, here, now
        return response

    async def stream(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        """A streamed answer sent until it ends or the client leaves, then closed."""
        sending = asyncio.create_task(self.send_response(response, send))
        leaving = asyncio.create_task(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait([sending, leaving], return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
            sending.cancel()  # nothing, if it is done
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await sending  # an error of the stream's own passes on
            finally:
                with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                    await leaving
                await sync_to_async(response.close)()


class ReusedRequestThreads:
    def __init__(self, app: Any, *, idle_max: int = 16) -> None:
        self.app = app
        self.idle_max = idle_max
        self.idle: list[ThreadPoolExecutor] = []  # only touched on the event loop

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        thread = self.idle.pop() if self.idle else ThreadPoolExecutor(1, "request")
        try:
            # Django's own ThreadSensitiveContext, inside, finds this one and keeps it.
            async with ThreadSensitiveContext(executor=thread):
                await self.app(scope, receive, send)
        finally:
            if len(self.idle) < self.idle_max:
                self.idle.append(thread)
            else:
                thread.shutdown(wait=False)

    async def close(self) -> None:
        """Closes the idle threads' database connections and ends the threads."""
        idle, self.idle = self.idle, []
        loop = asyncio.get_running_loop()
        for thread in idle:
            await loop.run_in_executor(thread, connections.close_all)
            thread.shutdown(wait=False)


class AccessLog:
    """An access log line for each HTTP response, as uvicorn writes it:
    `INFO:     127.0.0.1:50412 - "POST /api/v1/jobs HTTP/1.1" 201 Created`. The client
    is the one uvicorn's proxy headers middleware, outside, made of X-Forwarded-For."""

    _PHRASES = {status.value: status.phrase for status in HTTPStatus}

    def __init__(self, app: Any, stream: IO[str] | None = None) -> None:
        self.app = app
        self.stream = stream

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_logged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.write(scope, int(message["status"]))
            await send(message)

        await self.app(scope, receive, send_logged)

    def write(self, scope: dict[str, Any], status: int) -> None:
        client = scope.get("client")
        who = f"{client[0]}:{client[1]}" if client else "-"
        path = scope.get("root_path", "") + scope["path"]
        query = scope.get("query_string", b"")
        if query:
            path = f"{path}?{query.decode('latin-1')}"
        stream = self.stream or sys.stderr
        stream.write(
            f'INFO:     {who} - "{scope["method"]} {path} HTTP/{scope["http_version"]}" '
            f"{status} {self._PHRASES.get(status, '')}\n"
        )


def http_application(*, access_log: bool = False) -> Any:
    """Django's HTTP half of the ASGI application (Django is set up already), with its
    access log (`AccessLog`) where asked.

    Each cache of settings.CACHES is made here, once: Django keeps them in a
    context-local (`caches`), and each request's context is a copy of the one the server
    made its tasks in, so a cache first used by a request was made again by every
    request, and dropped after it (on Redis a client, its connection pool and a new
    connection each time; in memory, about 1% of a submission's CPU). Made in this
    context, before the server serves, every request's copy holds them. The backends
    settings allow (Redis, memory, files) are safe to share between threads."""
    for alias in settings.CACHES:
        caches[alias]  # noqa: B018 - made, and kept in this context
    app = ReusedRequestThreads(SyncChainASGIHandler())
    return AccessLog(app) if access_log else app
