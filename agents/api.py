"""The agent's HTTP API (docs/architecture.md, "Agent API"), called by the Celery workers.

Every route needs `Authorization: Bearer <cluster token>` (401 otherwise); a body that
cannot be what the route takes is a 400 with `{"error": message}`, which the worker does
not retry. A failure of this node itself (its spool is unwritable) is a 500, which it does.
"""

from __future__ import annotations

import hmac
import logging
import signal as signals
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agents.launcher import InvalidLaunch, Launcher, LaunchError, LaunchRequest

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
_MAX_SIGNAL = signals.SIGRTMAX


class BadRequest(Exception):
    pass


def create_app(*, launcher: Launcher, token: str) -> Starlette:
    if not token:
        raise ValueError("the agent API needs a cluster token")
    expected = f"Bearer {token}".encode()

    def guarded(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse({"error": "invalid or missing cluster token"}, 401)
            try:
                return await handler(request)
            except BadRequest as exc:
                return JSONResponse({"error": str(exc)}, 400)

        return endpoint

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "node": launcher.node})

    async def launch(request: Request) -> Response:
        body = await _json(request)
        job_id = _path_id(request)
        try:
            launch_request = LaunchRequest.from_payload(body)
            if launch_request.job_id != job_id:
                raise InvalidLaunch(f"job_id {launch_request.job_id} does not match the path")
            duplicate = await run_in_threadpool(launcher.launch, launch_request)
        except InvalidLaunch as exc:
            raise BadRequest(str(exc)) from exc
        except (LaunchError, OSError) as exc:
            log.exception("launch of job %s failed on this node", job_id)
            return JSONResponse({"error": f"node {launcher.node} cannot launch: {exc}"}, 500)
        return JSONResponse({"accepted": True, "duplicate": duplicate}, 202)

    async def signal(request: Request) -> Response:
        body = await _json(request)
        job_id = _path_id(request)
        unknown = set(body) - {"attempt", "signal", "kill_after_s"}
        if unknown:
            raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
        attempt = _int_field(body, "attempt", low=0)
        signum = _int_field(body, "signal", low=1, high=_MAX_SIGNAL)
        kill_after = body.get("kill_after_s")
        if kill_after is not None and (
            isinstance(kill_after, bool)
            or not isinstance(kill_after, int | float)
            or kill_after < 0
        ):
            raise BadRequest("kill_after_s must be a non-negative number or null")
        delivered = await run_in_threadpool(
            launcher.signal,
            job_id,
            attempt,
            signum,
            kill_after_s=None if kill_after is None else float(kill_after),
        )
        return JSONResponse({"delivered": delivered})

    async def jobs(request: Request) -> Response:
        return JSONResponse({"jobs": launcher.running()})

    return Starlette(
        routes=[
            Route("/v1/health", guarded(health), methods=["GET"]),
            Route("/v1/jobs", guarded(jobs), methods=["GET"]),
            Route("/v1/jobs/{job_id}/launch", guarded(launch), methods=["POST"]),
            Route("/v1/jobs/{job_id}/signal", guarded(signal), methods=["POST"]),
        ]
    )


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _path_id(request: Request) -> int:
    raw = request.path_params["job_id"]
    if not str(raw).isdigit():
        raise BadRequest(f"invalid job id {raw!r}")
    return int(raw)


def _int_field(body: dict[str, Any], key: str, *, low: int, high: int | None = None) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer")
    if value < low or (high is not None and value > high):
        raise BadRequest(f"{key} {value} is out of range")
    return value
