"""The short middleware chain of a tenant API request with a bearer token (spurcloud/
asgi_http.py, `TokenApiHandler`), as the ASGI server runs it: such a request skips what a
browser alone needs (sessions, CSRF, messages, time zone, allauth, htmx, static files)
and keeps the rest (security headers, the host check, the CSP); every other request,
a session's above all, still passes the whole chain, its CSRF check included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings as django_settings
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.handlers.base import BaseHandler
from django.middleware.csrf import CsrfViewMiddleware
from django.test import Client, RequestFactory, override_settings

from spurcloud.asgi_http import (
    ReusedRequestThreads,
    TokenApiHandler,
    http_application,
    token_api_request,
)
from spurcloud.tenants.services import create_api_token
from tests.spurcloud.conftest import Tenant

# The requests' threads hold connections of their own: what they write is committed.
pytestmark = pytest.mark.django_db(transaction=True)

SECURITY_HEADERS = {
    b"X-Frame-Options": b"DENY",
    b"X-Content-Type-Options": b"nosniff",
    b"Referrer-Policy": b"same-origin",
    b"Cross-Origin-Opener-Policy": b"same-origin",
}


@pytest.fixture
def browser_hooks() -> Iterator[dict[str, mock.MagicMock]]:
    """Spies on two of the browser's middleware: the session's and the CSRF check's."""
    with (
        mock.patch.object(
            SessionMiddleware,
            "process_request",
            autospec=True,
            side_effect=SessionMiddleware.process_request,
        ) as session,
        mock.patch.object(
            CsrfViewMiddleware,
            "process_view",
            autospec=True,
            side_effect=CsrfViewMiddleware.process_view,
        ) as csrf,
    ):
        yield {"session": session, "csrf": csrf}


@pytest.fixture
def app(browser_hooks: dict[str, mock.MagicMock]) -> Iterator[ReusedRequestThreads]:
    # After the spies: a chain keeps the view hooks (CSRF's) it found when it was built.
    served = http_application()
    assert isinstance(served, ReusedRequestThreads)
    yield served
    async_to_sync(served.close)()


def _request(
    app: Any, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers and body of a request, as the server receives them."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }

    async def exchange() -> tuple[int, dict[bytes, bytes], bytes]:
        server = ApplicationCommunicator(app, scope)
        await server.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await server.receive_output(10)
        assert start["type"] == "http.response.start", start
        content = b""
        while True:
            message = await server.receive_output(10)
            content += message.get("body", b"")
            if not message.get("more_body"):
                break
        await server.wait(10)
        return start["status"], dict(start["headers"]), content

    return async_to_sync(exchange)()


def _bearer(tenant: Tenant) -> dict[str, str]:
    _, secret = create_api_token(user=tenant.member, organization=tenant.organization, name="t")
    return {"Authorization": f"Bearer {secret}"}


def _session(user: Any) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}


def test_the_short_chain_is_every_middleware_but_the_browsers_in_order() -> None:
    kept = [type(m).__name__ for m in _chain(TokenApiHandler())]
    assert kept == [
        "SecurityMiddleware",
        "CommonMiddleware",
        "XFrameOptionsMiddleware",
        "ContentSecurityPolicyMiddleware",
    ]
    # A misspelt name would silently make an API request pay for it again.
    assert set(django_settings.BROWSER_ONLY_MIDDLEWARE) <= set(django_settings.MIDDLEWARE)


def test_the_short_chain_is_built_as_djangos_own_load_middleware_builds_it() -> None:
    """`TokenApiHandler.load_middleware` repeats the sync branch of Django's (which reads
    settings.MIDDLEWARE itself): given the same short list, Django's own must build the
    same thing, every attribute it sets included, or a Django upgrade changed it and the
    copy must follow."""
    short = [
        p for p in django_settings.MIDDLEWARE if p not in django_settings.BROWSER_ONLY_MIDDLEWARE
    ]
    ours = TokenApiHandler()
    with override_settings(MIDDLEWARE=short):
        djangos = BaseHandler()
        djangos.load_middleware(is_async=False)
    assert set(vars(djangos)) == set(vars(ours))

    def hooks(handler: BaseHandler, name: str) -> list[str]:
        return [f"{type(m.__self__).__name__}.{m.__name__}" for m in getattr(handler, name)]

    for name in ("_view_middleware", "_template_response_middleware", "_exception_middleware"):
        assert hooks(ours, name) == hooks(djangos, name), name
    assert [type(m) for m in _chain(ours)] == [type(m) for m in _chain(djangos)]  # type: ignore[arg-type]


def _chain(handler: TokenApiHandler) -> list[Any]:
    """The middleware instances of a chain, outermost first."""
    found, step = [], handler._middleware_chain
    while True:
        inner = getattr(step, "__wrapped__", step)  # convert_exception_to_response's
        if not hasattr(inner, "get_response"):
            return found
        found.append(inner)
        step = inner.get_response


@pytest.mark.parametrize(
    ("path", "authorization", "short"),
    [
        ("/api/v1/jobs", "Bearer spur_x", True),
        ("/api/v1/jobs", "bearer spur_x", True),  # as authentication reads the keyword
        ("/api/v1/jobs", "", False),  # no token: maybe a browser; DRF answers 401
        ("/api/v1/jobs", "Basic eDp5", False),
        ("/api/docs/", "Bearer spur_x", False),  # a page: its template reads the session
        ("/jobs/", "Bearer spur_x", False),  # the portal's
        ("/slurm/v0.0.41/jobs", "Bearer spur_x", False),  # its 404 is the portal's page
    ],
)
def test_which_requests_take_the_short_chain(path: str, authorization: str, short: bool) -> None:
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    assert token_api_request(RequestFactory().get(path, **headers)) is short


def test_a_token_request_skips_the_session_and_csrf_and_keeps_the_security_headers(
    app: ReusedRequestThreads, acme: Tenant, browser_hooks: dict[str, mock.MagicMock]
) -> None:
    # With a session cookie too: the token alone says who it is.
    headers = {**_bearer(acme), **_session(acme.owner)}
    status, answer, body = _request(app, "GET", "/api/v1/jobs", headers)
    assert status == 200, body
    assert json.loads(body)["results"] == []
    for name, value in SECURITY_HEADERS.items():
        assert answer[name] == value
    assert answer[b"Content-Security-Policy"].startswith(b"default-src 'self'")
    assert b"Set-Cookie" not in answer and b"Vary" not in answer
    assert browser_hooks["session"].call_count == browser_hooks["csrf"].call_count == 0


def test_a_bad_token_is_refused_on_the_short_chain_too(
    app: ReusedRequestThreads, acme: Tenant, browser_hooks: dict[str, mock.MagicMock]
) -> None:
    status, answer, body = _request(
        app, "GET", "/api/v1/jobs", {"Authorization": "Bearer spur_nope"}
    )
    assert (status, json.loads(body)["detail"]) == (401, "Invalid API token.")
    assert answer[b"X-Frame-Options"] == b"DENY"
    assert browser_hooks["session"].call_count == 0


def test_a_session_request_to_the_api_still_passes_the_whole_chain(
    app: ReusedRequestThreads, acme: Tenant, browser_hooks: dict[str, mock.MagicMock]
) -> None:
    status, _, _ = _request(app, "GET", "/api/v1/jobs", _session(acme.member))
    assert status == 401  # the API takes no session
    assert browser_hooks["session"].call_count == 1
    assert browser_hooks["csrf"].call_count == 1


def test_a_sessions_post_without_its_csrf_token_is_still_refused(
    app: ReusedRequestThreads, acme: Tenant, browser_hooks: dict[str, mock.MagicMock]
) -> None:
    form = b"name=t&scopes=read&expires_in_days="
    headers = {**_session(acme.member), "Content-Type": "application/x-www-form-urlencoded"}
    status, _, _ = _request(app, "POST", "/tokens/", headers, form)
    assert status == 403
    assert browser_hooks["csrf"].call_count == 1
    # ... and a bearer header does not lift it: the portal is no API operation.
    status, _, _ = _request(app, "POST", "/tokens/", {**headers, **_bearer(acme)}, form)
    assert status == 403


def test_the_api_docs_page_with_a_bearer_header_still_passes_the_whole_chain(
    app: ReusedRequestThreads, acme: Tenant, browser_hooks: dict[str, mock.MagicMock]
) -> None:
    status, answer, _ = _request(app, "GET", "/api/docs/", _bearer(acme))
    assert status == 200
    assert answer[b"X-Frame-Options"] == b"DENY"
    assert browser_hooks["session"].call_count == 1
