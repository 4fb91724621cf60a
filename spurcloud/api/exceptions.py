"""Errors as `{"detail": message}` with the status docs/architecture.md gives them."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from scheduler.client import ControllerError, ControllerUnavailable
from spurcloud.jobs.errors import JobRejected


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, JobRejected):
        return Response({"detail": exc.message}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ControllerUnavailable):
        return Response(
            {"detail": f"The scheduler is unreachable: {exc.message}"},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
        )
    if isinstance(exc, ControllerError):
        return Response(
            {"detail": f"The scheduler answered with an error: {exc.message}"},
            status=status.HTTP_502_BAD_GATEWAY,
        )
    response = exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" not in response.data:
        # Field validation errors: one readable line first, the per-field map kept beside it.
        response.data = {"detail": _first_message(response.data), "errors": response.data}
    elif response is not None and isinstance(response.data, list):
        response.data = {"detail": " ".join(str(m) for m in response.data)}
    return response


def _first_message(errors: Any, path: str = "") -> str:
    if isinstance(errors, dict):
        for key, value in errors.items():
            label = key if key != "non_field_errors" else ""
            return _first_message(value, f"{path}.{label}".strip(".") if label else path)
    if isinstance(errors, list) and errors:
        return _first_message(errors[0], path)
    return f"{path}: {errors}" if path else str(errors)
