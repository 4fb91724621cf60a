"""The controller's HTTP RPC API (docs/architecture.md, "Controller API").

Starlette; commits block until Raft applies them, so they run in the thread pool.
Every route checks the cluster token itself (cheaper than a middleware layer, which
costs a task and a queue per request).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.core.jobspec import JobSpec
from scheduler.core.resources import NodeSpec
from scheduler.ctld.controller import Controller
from scheduler.ctld.replica import ReplicaUnavailable

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
JOB_ACTIONS = frozenset({"hold", "release", "requeue", "requeuehold"})


class BadRequest(Exception):
    pass


def error(status: int, message: str, code: str = "") -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


def _int(data: dict[str, Any], key: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer")
    return value


def _id_set(text: str | None) -> set[int] | None:
    if not text:
        return None
    try:
        return {int(part) for part in text.split(",") if part}
    except ValueError as exc:
        raise BadRequest("ids must be a comma-separated list of integers") from exc


def build_app(controller: Controller, token: str) -> Starlette:
    expected = f"Bearer {token}".encode()

    def guarded(handler: Callable[[Request], Awaitable[Any]]) -> Handler:
        async def run(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return error(401, "missing or invalid cluster token", "unauthorized")
            try:
                result = await handler(request)
            except BadRequest as exc:
                return error(400, str(exc), "bad_request")
            except InvalidSpec as exc:
                return error(400, str(exc), "invalid")
            except Rejected as exc:
                status = 404 if exc.code == "not_found" else 400
                return error(status, exc.message, exc.code)
            except ReplicaUnavailable as exc:
                return error(503, str(exc), "unavailable")
            if isinstance(result, Response):
                return result
            return JSONResponse(result)

        return run

    async def ping(request: Request) -> Any:
        replica = controller.replica
        http = dict(controller.config.controller.raft_http)
        leader = replica.leader_address
        return {
            "ok": True,
            "leader": replica.is_leader,
            "leader_address": leader,
            "leader_url": http.get(leader, ""),
            "self": replica.self_address,
            "ready": replica.is_ready,
            "commit_index": replica.status().get("commit_idx", 0),
        }

    async def submit(request: Request) -> Any:
        body = await _body(request)
        spec = JobSpec.from_dict(body.get("spec"))
        key = body.get("idempotency_key", "")
        if not isinstance(key, str) or len(key) > 200:
            raise BadRequest("idempotency_key must be a string of at most 200 characters")
        job_id = await _in_thread(controller.submit, spec, idempotency_key=key)
        return JSONResponse({"job_id": job_id}, status_code=201)

    async def list_jobs(request: Request) -> Any:
        q = request.query_params
        states = set(q["states"].split(",")) if q.get("states") else None
        return {
            "jobs": controller.jobs(
                tenant=q.get("tenant"), states=states, ids=_id_set(q.get("ids")), user=q.get("user")
            )
        }

    async def get_job(request: Request) -> Any:
        job = controller.job(
            int(request.path_params["job_id"]), tenant=request.query_params.get("tenant")
        )
        if job is None:
            return error(404, "Invalid job id specified", "not_found")
        return job

    async def cancel(request: Request) -> Any:
        job_id = int(request.path_params["job_id"])
        body = await _body(request)
        tenant = body.get("tenant")
        if controller.job(job_id, tenant=tenant) is None:
            return error(404, "Invalid job id specified", "not_found")
        if body.get("signal") is not None:
            await _in_thread(controller.signal, job_id, _int(body, "signal"))
        else:
            await _in_thread(controller.cancel, job_id, by=str(body.get("by", "")))
        return controller.job(job_id)

    async def control(request: Request) -> Any:
        job_id = int(request.path_params["job_id"])
        action = request.path_params["action"]
        if action not in JOB_ACTIONS:
            return error(404, f"unknown job action {action}", "not_found")
        body = await _body(request)
        if controller.job(job_id, tenant=body.get("tenant")) is None:
            return error(404, "Invalid job id specified", "not_found")
        admin = body.get("admin", False)
        if not isinstance(admin, bool):
            raise BadRequest("admin must be true or false")
        await _in_thread(controller.control, job_id, action, admin=admin)
        return controller.job(job_id)

    async def nodes(request: Request) -> Any:
        return {"nodes": controller.nodes()}

    async def partitions(request: Request) -> Any:
        return {"partitions": controller.partitions()}

    async def register(request: Request) -> Any:
        node = NodeSpec.from_dict(await _body(request))
        await _in_thread(controller.register, node)
        return {"heartbeat_interval_s": controller.config.controller.node_timeout_s / 6}

    async def heartbeat(request: Request) -> Any:
        body = await _body(request)
        running = body.get("running", [])
        if not isinstance(running, list):
            raise BadRequest("running must be a list")
        pairs = [(_int(r, "job_id"), _int(r, "attempt")) for r in running if isinstance(r, dict)]
        return await _in_thread(controller.heartbeat, request.path_params["node"], pairs)

    async def started(request: Request) -> Any:
        body = await _body(request)
        await _in_thread(
            controller.started,
            int(request.path_params["job_id"]),
            attempt=_int(body, "attempt"),
            node=str(body.get("node", "")),
            pid=_int(body, "pid"),
        )
        return {"ok": True}

    async def finished(request: Request) -> Any:
        body = await _body(request)
        await _in_thread(
            controller.finished,
            int(request.path_params["job_id"]),
            attempt=_int(body, "attempt"),
            node=str(body.get("node", "")),
            exit_code=_int(body, "exit_code"),
            signal=_int(body, "signal", 0),
            reason=str(body.get("reason", "")),
        )
        return {"ok": True}

    routes = [
        Route("/v1/ping", guarded(ping)),
        Route("/v1/jobs", guarded(submit), methods=["POST"]),
        Route("/v1/jobs", guarded(list_jobs), methods=["GET"]),
        Route("/v1/jobs/{job_id:int}", guarded(get_job), methods=["GET"]),
        Route("/v1/jobs/{job_id:int}/cancel", guarded(cancel), methods=["POST"]),
        Route("/v1/jobs/{job_id:int}/started", guarded(started), methods=["POST"]),
        Route("/v1/jobs/{job_id:int}/finished", guarded(finished), methods=["POST"]),
        # After the routes above: it would match their paths too.
        Route("/v1/jobs/{job_id:int}/{action}", guarded(control), methods=["POST"]),
        Route("/v1/nodes", guarded(nodes), methods=["GET"]),
        Route("/v1/nodes/register", guarded(register), methods=["POST"]),
        Route("/v1/nodes/{node}/heartbeat", guarded(heartbeat), methods=["POST"]),
        Route("/v1/partitions", guarded(partitions), methods=["GET"]),
    ]
    return Starlette(routes=routes)


async def _in_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # Raft commits block until applied; keep them off the event loop.
    return await run_in_threadpool(func, *args, **kwargs)
