"""The server half: Starlette routes behind the cluster token, with bounded JSON bodies
and typed errors.

    app = rpc_app([Route("/v1/jobs", submit, methods=["POST"]), ...], token=..., max_body=...)

A handler takes a `Call` and returns what to answer: a JSON-able value (200), a
`(status, value)` pair, or a Starlette `Response`. It refuses by raising: an error of
`scheduler.rpc.errors`, or the core's `InvalidSpec` (400, with the field) and `Rejected`
(its code decides the status, `REJECTED_STATUS`). Each route checks the token itself:
cheaper than a middleware layer, which costs a task and a queue per request.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.rpc.errors import Refused, RpcError, Unauthorized, error_for

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 32 * 1024 * 1024  # a 4 MB script, JSON-escaped, and its environment

# The status of a core refusal, by its code; any other code is a plain 400.
REJECTED_STATUS = {
    "not_found": 404,
    "unavailable": 503,
    "not_pending": 409,
    "not_running": 409,
    "not_requeueable": 409,
    "permission": 403,
}


class Call:
    """One request, as a handler sees it."""

    def __init__(self, request: Request, max_body: int) -> None:
        self.request = request
        self._max_body = max_body

    @property
    def path(self) -> dict[str, Any]:
        return self.request.path_params

    @property
    def query(self) -> Any:
        return self.request.query_params

    async def body(self) -> dict[str, Any]:
        """The JSON object sent; Refused when it is too large, not JSON or not an object.
        An empty body is `{}`."""
        declared = self.request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body:
            raise Refused(
                f"the body is larger than {self._max_body} bytes", code="too_large", status=413
            )
        raw = bytearray()
        async for chunk in self.request.stream():
            raw += chunk
            if len(raw) > self._max_body:
                raise Refused(
                    f"the body is larger than {self._max_body} bytes", code="too_large", status=413
                )
        if not raw:
            return {}
        try:
            data = orjson.loads(raw)
        except (ValueError, RecursionError) as exc:  # orjson.JSONDecodeError is a ValueError
            raise Refused(f"the body is not valid JSON: {exc}", code="bad_json") from None
        if not isinstance(data, dict):
            raise Refused("the body must be a JSON object", code="bad_json")
        return data


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class RpcRoute:
    path: str
    handler: Handler
    methods: tuple[str, ...] = ("GET",)


class JsonResponse(Response):
    """A JSON answer encoded with orjson: a list of 10,000 jobs (squeue's) encodes in a
    few milliseconds, where the standard library's encoder takes tens. Keys that are not
    strings (node indexes) become strings, as `json.dumps` makes them."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)


def error_response(exc: RpcError) -> JsonResponse:
    return JsonResponse(exc.body(), status_code=exc.status)


def as_rpc_error(exc: Exception) -> RpcError | None:
    """The RPC error a raised exception stands for, or None (a bug: 500)."""
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, InvalidSpec):
        return Refused(exc.message, code="invalid")
    if isinstance(exc, Rejected):
        return error_for(REJECTED_STATUS.get(exc.code, 400), exc.message, exc.code)
    return None


def rpc_app(
    routes: Sequence[RpcRoute], *, token: str, max_body: int = DEFAULT_MAX_BODY
) -> Starlette:
    if not token:
        raise ValueError("an internal API needs a cluster token")
    expected = f"Bearer {token}".encode()

    def guarded(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return error_response(Unauthorized("missing or invalid cluster token"))
            try:
                result = await handler(Call(request, max_body))
            except Exception as exc:
                error = as_rpc_error(exc)
                if error is None:
                    raise
                return error_response(error)
            if isinstance(result, Response):
                return result
            if isinstance(result, tuple):
                status, value = result
                return JsonResponse(value, status_code=status)
            return JsonResponse(result)

        return endpoint

    return Starlette(
        routes=[Route(r.path, guarded(r.handler), methods=list(r.methods)) for r in routes]
    )


# -- typed fields of a body ---------------------------------------------------------------


def integer(
    body: dict[str, Any],
    key: str,
    *,
    low: int | None = None,
    high: int | None = None,
    default: int | None = None,
) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(f"{key} must be an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        raise Refused(f"{key} {value} is out of range")
    return value


def optional_integer(
    body: dict[str, Any], key: str, *, low: int | None = None, high: int | None = None
) -> int | None:
    if body.get(key) is None:
        return None
    return integer(body, key, low=low, high=high)


def number(body: dict[str, Any], key: str, *, low: float = 0.0, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise Refused(f"{key} must be a number from {low} to {high}, or null")
    return float(value)


def text(body: dict[str, Any], key: str, *, default: str = "", max_length: int = 1024) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or len(value) > max_length:
        raise Refused(f"{key} must be a string of at most {max_length} characters")
    return value


def boolean(body: dict[str, Any], key: str, *, default: bool = False) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise Refused(f"{key} must be true or false")
    return value


def only(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise Refused(f"unknown field(s): {', '.join(sorted(unknown))}")


def id_list(value: str | None, *, limit: int = 10_000) -> set[int] | None:
    """`1,2,3` as a set of ids (None when absent); Refused when malformed or too long."""
    if not value:
        return None
    parts = [p for p in value.split(",") if p]
    if len(parts) > limit:
        raise Refused(f"at most {limit} ids")
    if not all(p.isdigit() and len(p) <= 18 for p in parts):
        raise Refused("ids must be a comma-separated list of job ids")
    return {int(p) for p in parts}


__all__ = [
    "Call",
    "DEFAULT_MAX_BODY",
    "RpcRoute",
    "as_rpc_error",
    "boolean",
    "error_response",
    "id_list",
    "integer",
    "number",
    "only",
    "optional_integer",
    "rpc_app",
    "text",
]
