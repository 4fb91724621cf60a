"""Times in the viewer's time zone, with the zone said.

The browser knows its zone (`Intl.DateTimeFormat().resolvedOptions().timeZone`);
static/js/portal.js keeps it in the `spur_tz` cookie, and this middleware activates it
for the request, so every aware datetime a template prints (and the `when` filter) is in
that zone. The cookie is the visitor's own input: it is taken only when it names a zone
of the zoneinfo database, else the page stays in UTC (and says so). The websocket
consumers read the same cookie from their handshake (`zone_of_cookies`)."""

from __future__ import annotations

import functools
import re
import zoneinfo
from collections.abc import Callable, Mapping
from datetime import tzinfo
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

COOKIE = "spur_tz"
_NAME = re.compile(r"[A-Za-z0-9_+\-/]{1,64}")


@functools.cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone_named(name: str | None) -> tzinfo | None:
    """The zone `name` names (an IANA name such as Europe/Paris), or None."""
    if not name or not _NAME.fullmatch(name) or name not in _known_zones():
        return None
    return zoneinfo.ZoneInfo(name)


def zone_of_cookies(cookies: Mapping[str, str]) -> tzinfo | None:
    return zone_named(cookies.get(COOKIE))


class ViewerTimeZoneMiddleware:
    """Activates the viewer's zone for the request. Sync and async alike, as Django's own
    are: the web runs the chain sync, in one hop to the request's thread
    (spurcloud/asgi_http.py); Django's AsyncClient runs it async. The zone is a context
    variable: the view sees it either way."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        zone = zone_of_cookies(request.COOKIES)
        if zone is None:
            return self.get_response(request)
        with timezone.override(zone):
            return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        zone = zone_of_cookies(request.COOKIES)
        if zone is None:
            response: HttpResponse = await self.get_response(request)
            return response
        with timezone.override(zone):
            response = await self.get_response(request)
            return response
