"""List answers are `{"results": [...], "next": url or null}` (docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response


class JobHistoryPagination(CursorPagination):
    # A cursor, not page numbers: jobs keep arriving while a client pages through, and a
    # cursor on the job id neither skips nor repeats one. Ascending, as sacct prints.
    ordering = "job_id"
    page_size = settings.API_PAGE_SIZE
    # The largest of a page cut to `fields`; JobsApi's filters refuse more than
    # API_MAX_PAGE_SIZE whole jobs.
    max_page_size = max(settings.API_MAX_PAGE_SIZE, settings.API_MAX_PROJECTED_PAGE_SIZE)
    page_size_query_param = "limit"

    def get_page_size(self, request: Request) -> int | None:
        # A page of whole jobs holds at most API_MAX_PAGE_SIZE whatever `limit` asks
        # (the `next` link gives the rest); one cut to `fields`, up to the larger bound.
        size: int | None = super().get_page_size(request)
        if size is None or "fields" in request.query_params:
            return size
        return min(size, settings.API_MAX_PAGE_SIZE)

    def _get_position_from_instance(self, instance: Any, ordering: Any) -> str:
        # A page of tuples (`jobobject.history_tuples`) holds the job id first.
        if isinstance(instance, tuple):
            return str(instance[0])
        position: str = super()._get_position_from_instance(instance, ordering)
        return position

    def decode_cursor(self, request: Request) -> Any:
        # DRF answers a cursor it cannot read with 404; it is a malformed request.
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": ["Invalid cursor."]}) from None

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"results": data, "next": self.get_next_link()})

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return results_schema(schema)


def results_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["results", "next"],
        "properties": {
            "results": schema,
            "next": {"type": "string", "format": "uri", "nullable": True},
        },
    }


def unpaginated(results: list[Any]) -> dict[str, Any]:
    """The list shape for answers that come whole (the controller's live lists)."""
    return {"results": results, "next": None}
