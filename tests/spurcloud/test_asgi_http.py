"""The web's HTTP as the ASGI server runs it (spurcloud/asgi_http.py): the whole middleware
chain and the view in one thread, which the next request reuses with its database
connection; async views and streamed responses as before."""

from __future__ import annotations

import asyncio
import contextvars
import io
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.core.cache import CacheHandler
from django.db.backends.signals import connection_created
from django.test import Client

from spurcloud.asgi_http import AccessLog, ReusedRequestThreads, http_application
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import record
from tests.spurcloud.test_job_output import FakeAgent, agent  # noqa: F401  (its fixture)

# The requests' threads hold connections of their own: what they write is committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def app() -> Any:
    served = http_application()
    yield served
    async_to_sync(served.close)()  # its threads' connections, before the test database goes


def _session_cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def _get_scope(path: str, headers: list[tuple[bytes, bytes]], query: bytes = b"") -> dict[str, Any]:
    """The ASGI scope of a GET from 127.0.0.1 to the test server."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


async def _get(
    app: Any, path: str, cookie: bytes = b"", query: bytes = b""
) -> tuple[int, dict[bytes, bytes], list[bytes]]:
    """Status, headers and each body message of a GET, as the server receives them."""
    headers = [(b"host", b"testserver")] + ([(b"cookie", cookie)] if cookie else [])
    server = ApplicationCommunicator(app, _get_scope(path, headers, query))
    await server.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await server.receive_output(10)
    assert start["type"] == "http.response.start", start
    bodies = []
    while True:
        message = await server.receive_output(10)
        bodies.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    await server.wait(10)
    return start["status"], dict(start["headers"]), bodies


def test_a_page_passes_every_middleware(app: ReusedRequestThreads, acme: Tenant) -> None:
    cookie = _session_cookie(acme.member)

    async def scenario() -> None:
        status, headers, _ = await _get(app, "/")
        assert (status, headers[b"Location"]) == (302, b"/accounts/login/?next=/")
        status, headers, bodies = await _get(app, "/jobs/", cookie)
        assert status == 200
        assert b"Jobs of Acme" in b"".join(bodies)
        assert headers[b"X-Frame-Options"] == b"DENY"
        assert headers[b"Content-Security-Policy"].startswith(b"default-src 'self'")
        status, headers, _ = await _get(app, "/static/css/spur.css")
        assert (status, headers[b"Content-Type"]) == (200, b'text/css; charset="utf-8"')

    async_to_sync(scenario)()


def test_the_next_request_reuses_the_thread_and_its_database_connection(
    app: ReusedRequestThreads, db: None
) -> None:
    opened: list[Any] = []

    def note(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(connection)

    connection_created.connect(note)
    try:

        async def scenario() -> None:
            for _ in range(3):
                status, _, bodies = await _get(app, "/healthz")
                assert status == 200, bodies

        async_to_sync(scenario)()
    finally:
        connection_created.disconnect(note)
    assert len(opened) == 1  # Django's own handler: one a request
    assert len(app.idle) == 1


def test_the_caches_are_made_once_not_by_each_request(db: None, monkeypatch: Any) -> None:
    made: list[str] = []
    create = CacheHandler.create_connection

    def noted(self: CacheHandler, alias: str) -> Any:
        made.append(alias)
        return create(self, alias)

    monkeypatch.setattr(CacheHandler, "create_connection", noted)

    async def scenario(app: Any) -> None:
        # Called in this task's context, as the server's tasks call it (the
        # ApplicationCommunicator of the other tests runs it in an empty one).
        scope = _get_scope("/api/v1/jobs", [(b"host", b"testserver")])
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        for _ in range(3):  # the per-address limit counts each on the cache
            await app(scope, receive, send)
        assert [m["status"] for m in sent if "status" in m] == [401] * 3

    # A context of its own, as a fresh server's: no cache made in it before.
    context = contextvars.Context()
    served = context.run(http_application)
    try:
        assert sorted(made) == sorted(settings.CACHES)
        context.run(async_to_sync(scenario), served)
    finally:
        async_to_sync(served.close)()
    assert sorted(made) == sorted(settings.CACHES)  # none again by a request


def test_requests_at_once_each_have_a_thread(app: ReusedRequestThreads, db: None) -> None:
    async def scenario() -> None:
        answers = await asyncio.gather(*(_get(app, "/healthz") for _ in range(4)))
        assert [status for status, _, _ in answers] == [200] * 4

    async_to_sync(scenario)()
    assert 1 < len(app.idle) <= 4


def test_an_async_view_answers(app: ReusedRequestThreads, db: None) -> None:
    async def scenario() -> None:
        status, headers, _ = await _get(app, "/sessions/7/jupyter/lab")
        assert status == 302
        assert headers[b"Location"].startswith(b"/accounts/login/")

    async_to_sync(scenario)()


def test_a_streamed_download_is_sent_a_chunk_at_a_time(
    app: ReusedRequestThreads,
    acme: Tenant,
    agent: FakeAgent,  # noqa: F811  (the fixture)
    settings: Any,
) -> None:
    settings.API_OUTPUT_MAX_BYTES = 8
    agent.outputs[41] = {"stdout": "epoch 1 loss 0.9\nepoch 2 loss 0.5\n", "stderr": ""}
    record(41, state="RUNNING", reason="None", nodes=["node02"], attempt=1)
    cookie = _session_cookie(acme.member)

    async def scenario() -> None:
        status, _, bodies = await _get(app, "/jobs/41/stdout", cookie)
        assert status == 200
        assert b"".join(bodies) == b"epoch 1 loss 0.9\nepoch 2 loss 0.5\n"
        assert len([b for b in bodies if b]) == 5  # as the agent answered: 8 bytes each

    async_to_sync(scenario)()


def test_each_response_writes_one_access_log_line_in_uvicorns_words(db: None) -> None:
    served = http_application(access_log=True)
    assert isinstance(served, AccessLog)
    served.stream = io.StringIO()
    try:
        status, _, _ = async_to_sync(_get)(served, "/api/v1/jobs", query=b"state=RUNNING")
        async_to_sync(_get)(served, "/no-such-page")
    finally:
        async_to_sync(served.app.close)()
    assert status == 401  # no token
    assert served.stream.getvalue().splitlines() == [
        'INFO:     127.0.0.1:50000 - "GET /api/v1/jobs?state=RUNNING HTTP/1.1" 401 Unauthorized',
        'INFO:     127.0.0.1:50000 - "GET /no-such-page HTTP/1.1" 404 Not Found',
    ]


def test_a_stream_stops_and_closes_when_its_client_leaves(
    app: ReusedRequestThreads, db: None, settings: Any
) -> None:
    from tests.spurcloud import endless_stream_urls

    settings.ROOT_URLCONF = "tests.spurcloud.endless_stream_urls"
    endless_stream_urls.closed.clear()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/endless", "raw_path": b"/endless", "query_string": b"",
        "root_path": "", "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }  # fmt: skip

    async def scenario() -> None:
        server = ApplicationCommunicator(app, scope)
        await server.send_input({"type": "http.request", "body": b"", "more_body": False})
        assert (await server.receive_output(10))["status"] == 200
        assert (await server.receive_output(10))["body"] == b"tick\n"
        await server.send_input({"type": "http.disconnect"})
        await server.wait(10)  # the application returns: it does not stream on

    async_to_sync(scenario)()
    assert endless_stream_urls.closed.wait(10)
