"""JSON, never HTML, for every path under /api/: the catch-all 404 of the API's routes,
and Django's error handlers (400, 403, 404, 500), which answer JSON there and the usual
pages elsewhere."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import csrf, defaults
from django.views.decorators.csrf import csrf_exempt

API_PREFIX = "/api/"


def _json(status: int, detail: str, code: str) -> JsonResponse:
    return JsonResponse({"detail": detail, "code": code}, status=status)


@csrf_exempt  # a POST to an unknown path is a 404, not a CSRF failure
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    return _json(404, "Not found.", "not_found")


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return _json(403, "CSRF verification failed.", "csrf_failed")
    return csrf.csrf_failure(request, reason)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return _json(400, "Bad request.", "bad_request")
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return _json(403, "You do not have permission to do this.", "permission_denied")
    return defaults.permission_denied(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return not_found(request)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return _json(500, "The server failed; the error was logged.", "server_error")
    return defaults.server_error(request)
