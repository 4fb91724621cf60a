"""The server half: routes behind the cluster token, with bounded JSON bodies and typed
errors, served by a lean ASGI path.

    app = rpc_app([RpcRoute("/v1/jobs", submit, ("POST",)), ...], token=..., max_body=...)

A handler takes a `Call` and returns what to answer: a JSON-able value (200), a
`(status, value)` pair, or a Starlette `Response`. It refuses by raising: an error of
`scheduler.rpc.errors`, or the core's `InvalidSpec` (400, with the field) and `Rejected`
(its code decides the status, `REJECTED_STATUS`). Each route checks the token itself:
cheaper than a middleware layer, which costs a task and a queue per request.

The app is a `Starlette` (`RpcApp`), so routes of other kinds (a step credential's, a
websocket, /metrics) sit in `app.router.routes` beside ours, in order. A request that
one of our routes takes, by Starlette's own rule (the first route that matches path and
method), skips Starlette's middleware, router and request objects: `RpcApp` finds the
route (a dict lookup for a path without parameters), and the route (`_Guarded`, a plain
ASGI app) reads the token and the body from the ASGI scope and messages and sends its
orjson answer as two messages. What Starlette's stack did for it stays: a path's
parameters converted as the route declares them, 500 "Internal Server Error" for an
exception that is not a refusal (raised again, for the server's log), the client's
disconnect while the body is read raised as Starlette's `ClientDisconnect`. Everything
else (404, 405, the other routes) goes through Starlette as before.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Receive, Scope, Send

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
    "not_suspended": 409,
    "permission": 403,
}

# Paths without parameters whose route `RpcApp` remembers (a bound: a client sending
# ever new paths fills it once, then they are looked up as Starlette would).
STATIC_CACHE = 1024


class Call:
    """One request, as a handler sees it: from its ASGI scope and `receive`."""

    __slots__ = ("_headers", "_max_body", "_query", "_receive", "_request", "scope")

    def __init__(self, scope: Scope, receive: Receive, max_body: int) -> None:
        self.scope = scope
        self._receive = receive
        self._max_body = max_body
        self._headers: Headers | None = None
        self._query: QueryParams | None = None
        self._request: Request | None = None

    @classmethod
    def of(cls, request: Request, max_body: int) -> Call:
        """The call of a request that a Starlette endpoint got."""
        return cls(request.scope, request.receive, max_body)

    @property
    def path(self) -> dict[str, Any]:
        params: dict[str, Any] = self.scope.get("path_params", {})
        return params

    @property
    def query(self) -> QueryParams:
        if self._query is None:
            self._query = QueryParams(self.scope["query_string"])
        return self._query

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(scope=self.scope)
        return self._headers

    @property
    def request(self) -> Request:
        """Starlette's request object, for what the above does not give (its body is
        `body()`'s: read one or the other)."""
        if self._request is None:
            self._request = Request(self.scope, self._receive)
        return self._request

    async def body(self) -> dict[str, Any]:
        """The JSON object sent; Refused when it is too large, not JSON or not an object.
        An empty body is `{}`."""
        declared = _header(self.scope, b"content-length")
        if declared.isdigit() and int(declared) > self._max_body:
            raise Refused(
                f"the body is larger than {self._max_body} bytes", code="too_large", status=413
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] != "http.request":  # http.disconnect
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
                if size > self._max_body:
                    raise Refused(
                        f"the body is larger than {self._max_body} bytes",
                        code="too_large",
                        status=413,
                    )
            if not message.get("more_body", False):
                break
        if not chunks:
            return {}
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            data = orjson.loads(raw)
        except (ValueError, RecursionError) as exc:  # orjson.JSONDecodeError is a ValueError
            raise Refused(f"the body is not valid JSON: {exc}", code="bad_json") from None
        if not isinstance(data, dict):
            raise Refused("the body must be a JSON object", code="bad_json")
        return data


def _header(scope: Scope, name: bytes) -> str:
    """The first value of header `name` (lower case), or "" (as `Headers.get`)."""
    for key, value in scope["headers"]:
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return ""


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
        return encode(content)


def encode(content: Any) -> bytes:
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


_JSON_TYPE = (b"content-type", b"application/json")
_SERVER_ERROR = b"Internal Server Error"


async def send_json(send: Send, status: int, content: Any) -> None:
    """A JSON answer, as `JsonResponse` sends it, without the response object."""
    body = encode(content)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", str(len(body)).encode()), _JSON_TYPE],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Guarded:
    """One route's handler behind the cluster token, as a plain ASGI app (Starlette's
    `Route` calls it as one too)."""

    __slots__ = ("expected", "handler", "max_body")

    def __init__(self, handler: Handler, expected: bytes, max_body: int) -> None:
        self.handler = handler
        self.expected = expected
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                given = value
                break
        if not hmac.compare_digest(given, self.expected):
            exc: RpcError = Unauthorized("missing or invalid cluster token")
            await send_json(send, exc.status, exc.body())
            return
        try:
            result = await self.handler(Call(scope, receive, self.max_body))
        except Exception as exc_:
            error = as_rpc_error(exc_)
            if error is None:
                # Nothing was sent: the 500 Starlette's ServerErrorMiddleware would send,
                # and the exception again for the server to log.
                await send(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [
                            (b"content-length", str(len(_SERVER_ERROR)).encode()),
                            (b"content-type", b"text/plain; charset=utf-8"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": _SERVER_ERROR})
                raise
            await send_json(send, error.status, error.body())
            return
        if isinstance(result, Response):
            await result(scope, receive, send)
        elif isinstance(result, tuple):
            status, value = result
            await send_json(send, status, value)
        else:
            await send_json(send, 200, result)


class RpcApp(Starlette):
    """Starlette, with the requests its `_Guarded` routes take served directly (module
    docstring). Routes may be added to `router.routes` before it serves."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        super().__init__(routes=list(routes))
        # (method, path, root_path) -> the route's app and scope, or None (Starlette's)
        self._static: dict[tuple[str, str, str], tuple[_Guarded, Any] | None] = {}
        self._routes_seen = -1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = self._find(scope)
            if found is not None:
                guarded, child = found
                scope["app"] = self
                scope["router"] = self.router
                scope.update(child)
                await guarded(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _find(self, scope: Scope) -> tuple[_Guarded, Any] | None:
        """Our route that Starlette's router would pick for this request, with the scope
        it would add (endpoint, path_params), or None: Starlette serves it."""
        routes = self.router.routes
        if len(routes) != self._routes_seen:  # routes were added: look again
            self._static.clear()
            self._routes_seen = len(routes)
        key = (scope["method"], scope["path"], scope.get("root_path", ""))
        try:
            return self._static[key]
        except KeyError:
            pass
        for route in routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                endpoint = getattr(route, "endpoint", None)
                found = (endpoint, child) if isinstance(endpoint, _Guarded) else None
                if not child.get("path_params") and len(self._static) < STATIC_CACHE:
                    self._static[key] = found
                return found
        return None


def rpc_app(routes: Sequence[RpcRoute], *, token: str, max_body: int = DEFAULT_MAX_BODY) -> RpcApp:
    if not token:
        raise ValueError("an internal API needs a cluster token")
    expected = f"Bearer {token}".encode()
    return RpcApp(
        [
            Route(r.path, _Guarded(r.handler, expected, max_body), methods=list(r.methods))
            for r in routes
        ]
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
    "RpcApp",
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
    "send_json",
    "text",
]
