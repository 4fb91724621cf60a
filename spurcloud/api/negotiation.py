"""The API's content negotiation: DRF's, with the answer to what nearly every client
asks (no Accept header, `*/*` or `application/json`, and no `?format=`) given at once:
JSON, which DRF's own would choose after parsing the header and ranking its media types
(2% of the web's CPU a submission). Anything else is DRF's to negotiate."""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

JSON = "application/json"
PLAIN_ACCEPTS = frozenset({"*/*", JSON})


class JsonFirstNegotiation(DefaultContentNegotiation):
    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)  # the view's list (DRF's get_renderers)
        if (
            not format_suffix
            and renderers
            and renderers[0].media_type == JSON
            and request.META.get("HTTP_ACCEPT", "*/*") in PLAIN_ACCEPTS
            and self.settings.URL_FORMAT_OVERRIDE not in request.query_params
        ):
            return renderers[0], JSON
        renderer, media_type = super().select_renderer(request, renderers, format_suffix)
        return renderer, str(media_type)
