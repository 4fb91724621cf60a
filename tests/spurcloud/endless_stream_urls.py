"""A URL configuration for tests/spurcloud/test_asgi_http.py: one view that streams
without end (an async iterator, as the web's own streams are) until it is closed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from django.http import HttpRequest, StreamingHttpResponse
from django.urls import path

closed = threading.Event()


def endless(request: HttpRequest) -> StreamingHttpResponse:
    async def chunks() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"tick\n"
                await asyncio.sleep(0.01)
        finally:
            closed.set()  # the iterator closed: the stream stopped

    return StreamingHttpResponse(chunks())


urlpatterns = [path("endless", endless)]
