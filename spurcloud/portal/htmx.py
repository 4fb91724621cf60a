"""The portal's side of htmx (static/vendor/htmx/): a page's live or changing part is a
fragment template of its own, which the page includes and which the view answers alone to
a request from htmx (`HX-Request`); any other request, and htmx's reload of a page from
history, gets the whole page. Without JavaScript every form and link still works as a
plain request.

Both answers say `Vary: HX-Request`, so that no cache hands a fragment to a page load or
the page to htmx. A redirect is no answer for htmx (its XMLHttpRequest would follow it
and swap the page it lands on, the sign-in page for a session that expired, into the
fragment's place): the middleware turns it into `HX-Redirect`, which htmx follows as a
navigation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.contrib.messages import get_messages
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.utils.decorators import sync_and_async_middleware

REQUEST_HEADER = "HX-Request"
MESSAGES_TEMPLATE = "portal/_messages.html"


def is_htmx(request: HttpRequest) -> bool:
    """Whether htmx asks for a fragment (not a reload of a page from its history)."""
    headers = request.headers
    return headers.get(REQUEST_HEADER) == "true" and headers.get("HX-History-Restore-Request") != (
        "true"
    )


def page_or_fragment(
    request: HttpRequest,
    *,
    page: str,
    template: str,
    context: dict[str, Any],
    status: int = 200,
) -> HttpResponse:
    """The fragment (with the messages that came with it, swapped into the page's
    message area out of band) for htmx, the page that includes it otherwise."""
    if is_htmx(request):
        return fragment(request, template, context, status=status)
    response = render(request, page, context, status=status)
    patch_vary_headers(response, [REQUEST_HEADER])
    return response


def fragment(
    request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    """A fragment for htmx, and the messages that came with it (swapped into the page's
    message area out of band)."""
    body = render_to_string(template, context, request) + render_to_string(
        MESSAGES_TEMPLATE, {"messages": get_messages(request), "oob": True}, request
    )
    response = HttpResponse(body, status=status)
    patch_vary_headers(response, [REQUEST_HEADER])
    return response


def _for_htmx(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    if is_htmx(request) and 300 <= response.status_code < 400 and "Location" in response:
        answer = HttpResponse(status=204)
        answer["HX-Redirect"] = response["Location"]
        for name, morsel in response.cookies.items():  # a sign-out's, a new session's
            answer.cookies[name] = morsel
        response = answer
    if REQUEST_HEADER in request.headers:
        patch_vary_headers(response, [REQUEST_HEADER])
    return response


@sync_and_async_middleware
def HtmxRedirectMiddleware(  # noqa: N802  (a middleware is named as a class is)
    get_response: Callable[[HttpRequest], Any],
) -> Callable[[HttpRequest], Any]:
    """Redirects for htmx as `HX-Redirect`. Sync and async alike: the web runs the chain
    sync (spurcloud/asgi_http.py), Django's AsyncClient async."""
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponseBase:
            response = await get_response(request)
            return _for_htmx(request, response)

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponseBase:
        return _for_htmx(request, get_response(request))

    return middleware


__all__ = ["HtmxRedirectMiddleware", "fragment", "is_htmx", "page_or_fragment"]
