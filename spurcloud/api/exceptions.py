"""Errors as `{"detail": message, "code": word}` (plus `errors`, per field, for validation)
with the status docs/architecture.md gives them. The controller's refusals arrive as the
RPC kit's errors and keep their meaning: `Refused` 400, `NotFound` 404, `Conflict` 409,
`Unavailable` 503. Billing: `PaymentRequired` 402 (credit used up), `BillingRefused` 400,
`PaymentProviderError` 502 (Stripe)."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from scheduler.rpc.errors import Conflict, NotFound, Refused, RpcError, Unavailable
from spurcloud.billing.errors import BillingRefused, PaymentProviderError, PaymentRequired
from spurcloud.jobs.errors import JobOutputUnavailable, JobRejected

_CODES = {403: "permission_denied", 404: "not_found"}  # Django's own errors have no code


def _answer(status_code: int, detail: str, code: str, **extra: Any) -> Response:
    return Response({"detail": detail, "code": code, **extra}, status=status_code)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, JobRejected):
        extra = {"errors": {exc.field: [exc.message]}} if exc.field else {}
        return _answer(status.HTTP_400_BAD_REQUEST, exc.message, "invalid", **extra)
    if isinstance(exc, PaymentRequired):
        return _answer(status.HTTP_402_PAYMENT_REQUIRED, exc.message, "payment_required")
    if isinstance(exc, BillingRefused):
        extra = {"errors": {exc.field: [exc.message]}} if exc.field else {}
        return _answer(status.HTTP_400_BAD_REQUEST, exc.message, "invalid", **extra)
    if isinstance(exc, PaymentProviderError):
        return _answer(status.HTTP_502_BAD_GATEWAY, exc.message, "payment_provider")
    if isinstance(exc, JobOutputUnavailable):
        return _answer(status.HTTP_503_SERVICE_UNAVAILABLE, exc.message, "unavailable")
    if isinstance(exc, Unavailable) and exc.status == 503:
        return _answer(503, f"The scheduler is unreachable: {exc.message}", exc.code)
    if isinstance(exc, Refused | NotFound | Conflict):
        return _answer(exc.status, exc.message, exc.code)
    if isinstance(exc, RpcError):
        return _answer(502, f"The scheduler answered with an error: {exc.message}", exc.code)
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", None) or _CODES.get(response.status_code, "error")
    if isinstance(response.data, dict) and "detail" not in response.data:
        # Field validation errors: one readable line first, the per-field map beside it.
        response.data = {
            "detail": _first_message(response.data),
            "code": "invalid",
            "errors": response.data,
        }
    elif isinstance(response.data, list):
        response.data = {"detail": " ".join(str(m) for m in response.data), "code": "invalid"}
    elif isinstance(response.data, dict):
        response.data = {"detail": str(response.data["detail"]), "code": str(code)}
    return response


def _first_message(errors: Any, path: str = "") -> str:
    if isinstance(errors, dict):
        for key, value in errors.items():
            label = key if key != "non_field_errors" else ""
            return _first_message(value, f"{path}.{label}".strip(".") if label else path)
    if isinstance(errors, list) and errors:
        return _first_message(errors[0], path)
    message = str(errors)
    # The core's messages name their field already ("nodes must be at least 1").
    return f"{path}: {message}" if path and path not in message else message
