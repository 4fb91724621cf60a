"""The agent's HTTP API (docs/architecture.md, "Agent API"), called by the Celery workers,
on the RPC kit (`scheduler.rpc.server`). `GET /v1/jobs/{id}/output` serves the web a
piece of a job's output (agents/output.py).

Every route needs `Authorization: Bearer <cluster token>` (401 otherwise); a body that
cannot be what the route takes is a 400, which the worker does not retry. A failure of
this node itself (its spool is unwritable) is a 503, which it does. The exceptions take
a credential of their own instead: a job step's routes (agents/step_routes.py: the
controller's signature, then the step's I/O credential), the web terminal (a terminal
token) and a session's web service (a service token).
"""

from __future__ import annotations

import logging
import signal as signals
import time
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from agents import step_routes, terminal
from agents.credentials import NodeCredential
from agents.launch_request import StaleLaunch
from agents.launcher import InvalidLaunch, Launcher, LaunchError, LaunchRequest
from agents.output import DEFAULT_LIMIT, MAX_LIMIT, STREAMS
from agents.service_proxy import ServiceProxy
from agents.ssh import SshService
from scheduler.rpc import server as rpc
from scheduler.rpc import signatures
from scheduler.rpc.errors import Conflict, NotFound, Refused, RpcError, Unavailable
from scheduler.rpc.server import Call, RpcRoute

log = logging.getLogger(__name__)

_MAX_SIGNAL = int(signals.SIGRTMAX)
_MAX_KILL_AFTER_S = 24 * 3600.0
MAX_LAUNCH_BATCH = 64  # the controller sends at most 32 (scheduler/ctld/dispatch.py)


def create_app(
    *,
    launcher: Launcher,
    token: str,
    credential: NodeCredential | None = None,
    ssh: SshService | None = None,
) -> Starlette:
    """`credential`: launches and signals must carry the controller's signature made with
    it (scheduler/rpc/signatures.py); None only in tests of the routes themselves.
    `ssh`: the agent's SSH server into its jobs (agents/ssh.py), when it offers one."""

    def check(kind: str, fields: dict[str, Any], signature: Any) -> None:
        if credential is None:
            return
        key = credential.key
        if key is None:
            raise Unavailable(f"node {launcher.node} has not registered yet: try again")
        signatures.verify(key, kind, fields, signature, node=launcher.node, now=time.time())

    async def health(call: Call) -> Any:
        return {"ok": True, "node": launcher.node}

    def checked(body: Any, job_id: int | None) -> LaunchRequest:
        """One launch, its signature and fields checked: what both launch routes do for
        each launch they take. `job_id`: the path's, which the payload must match."""
        if not isinstance(body, dict):
            raise Refused("a launch must be a JSON object")
        check("launch", signatures.launch_fields(body), body.pop("signature", None))
        try:
            request = LaunchRequest.from_payload(body)
            if job_id is not None and request.job_id != job_id:
                raise InvalidLaunch(f"job_id {request.job_id} does not match the path")
        except InvalidLaunch as exc:
            raise Refused(str(exc)) from exc
        return request

    def answer(request: LaunchRequest, result: bool | Exception) -> dict[str, Any]:
        """The launcher's result as the API answers it (an error raised as its RpcError)."""
        if isinstance(result, InvalidLaunch):
            raise Refused(str(result)) from result
        if isinstance(result, StaleLaunch):
            log.warning("refused a stale launch: %s", result)
            raise Conflict(str(result)) from result
        if isinstance(result, LaunchError | OSError):
            log.error("launch of job %s failed on this node: %s", request.job_id, result)
            raise Unavailable(f"node {launcher.node} cannot launch: {result}") from result
        if isinstance(result, Exception):
            raise result
        return {"accepted": True, "duplicate": result}

    def launch_one(body: Any, job_id: int | None) -> dict[str, Any]:
        request = checked(body, job_id)
        try:
            result: bool | Exception = launcher.launch(request)
        except (InvalidLaunch, StaleLaunch, LaunchError, OSError) as exc:
            result = exc
        return answer(request, result)

    async def launch(call: Call) -> Any:
        body = await call.body()
        job_id = _path_id(call)
        return 202, await run_in_threadpool(launch_one, body, job_id)

    def launch_all(launches: list[Any]) -> list[dict[str, Any]]:
        """Each launch checked, then all of them started side by side (Launcher.launch_all)
        and answered on its own: a refused one refuses none of its neighbours."""
        results: list[dict[str, Any]] = []
        requests: list[tuple[int, LaunchRequest]] = []
        for body in launches:
            key = _launch_key(body)
            try:
                requests.append((len(results), checked(body, None)))
                results.append(key)
            except RpcError as exc:
                results.append({**key, "error": {**exc.body(), "status": exc.status}})
        started = launcher.launch_all([request for _, request in requests])
        for (index, request), result in zip(requests, started, strict=True):
            try:
                results[index] = {**results[index], **answer(request, result)}
            except RpcError as exc:
                results[index] = {**results[index], "error": {**exc.body(), "status": exc.status}}
        return results

    async def launches(call: Call) -> Any:
        body = await call.body()
        rpc.only(body, {"launches"})
        batch = body.get("launches")
        if not isinstance(batch, list) or not 1 <= len(batch) <= MAX_LAUNCH_BATCH:
            raise Refused(f"launches must be a list of 1 to {MAX_LAUNCH_BATCH} launch payloads")
        return {"results": await run_in_threadpool(launch_all, batch)}

    async def signal(call: Call) -> Any:
        body = await call.body()
        job_id = _path_id(call)
        rpc.only(body, {"attempt", "signal", "kill_after_s", "signature", "step_id"})
        signed = {**body, "node": launcher.node}
        check("signal", signatures.signal_fields(signed, job_id), body.get("signature"))
        attempt = rpc.integer(body, "attempt", low=0)
        signum = rpc.integer(body, "signal", low=1, high=_MAX_SIGNAL)
        kill_after = rpc.number(body, "kill_after_s", high=_MAX_KILL_AFTER_S)
        step_id = rpc.optional_integer(body, "step_id", low=0)
        if step_id is not None:  # scancel N.S: that step's tasks on this node only
            delivered = await run_in_threadpool(
                launcher.steps.signal, job_id, attempt, signum, step_id
            )
            return {"delivered": delivered}
        delivered = await run_in_threadpool(
            launcher.signal, job_id, attempt, signum, kill_after_s=kill_after
        )
        return {"delivered": delivered}

    async def jobs(call: Call) -> Any:
        return {"jobs": launcher.running()}

    async def output(call: Call) -> Any:
        job_id = _path_id(call)
        stream = call.query.get("stream", "stdout")
        if stream not in STREAMS:
            raise Refused(f"stream must be one of: {', '.join(STREAMS)}")
        offset = _query_int(call, "offset", 0)
        limit = min(_query_int(call, "limit", DEFAULT_LIMIT), MAX_LIMIT)
        piece = await run_in_threadpool(
            launcher.output, job_id, stream=stream, offset=offset, limit=limit
        )
        if piece is None:
            raise NotFound(f"job {job_id} was never launched on node {launcher.node}")
        return piece

    async def ssh_activity(call: Call) -> Any:
        """A job's SSH sessions here and when they last relayed a byte, for the web's idle
        culling (a session used over SSH is in use)."""
        job_id = _path_id(call)
        found = ssh.activity(job_id) if ssh is not None else {"sessions": 0, "active_at": None}
        return {"job_id": job_id, **found}

    app = rpc.rpc_app(
        [
            RpcRoute("/v1/health", health),
            RpcRoute("/v1/jobs", jobs),
            RpcRoute("/v1/jobs/{job_id}/launch", launch, ("POST",)),
            RpcRoute("/v1/launches", launches, ("POST",)),
            RpcRoute("/v1/jobs/{job_id}/signal", signal, ("POST",)),
            RpcRoute("/v1/jobs/{job_id}/output", output),
            RpcRoute("/v1/jobs/{job_id}/ssh", ssh_activity),
        ],
        token=token,
    )
    # Signed by the controller, or behind a step's I/O credential, not the cluster token.
    app.router.routes[0:0] = step_routes.routes(launcher, credential)
    # The terminal token, not the cluster token (agents/terminal.py).
    app.router.routes.insert(0, terminal.route(launcher, credential))
    # A session's web service: behind a service token, not the cluster token.
    app.router.routes[0:0] = ServiceProxy(launcher, credential).routes()
    return app


def _launch_key(body: Any) -> dict[str, Any]:
    """The (job_id, attempt) a launch names, as sent: its result says which it answers."""
    if not isinstance(body, dict):
        return {"job_id": None, "attempt": None}
    return {"job_id": body.get("job_id"), "attempt": body.get("attempt")}


def _query_int(call: Call, key: str, default: int) -> int:
    raw = call.query.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > 18:
        raise Refused(f"{key} must be a non-negative integer")
    return int(raw)


def _path_id(call: Call) -> int:
    return _path_id_of(str(call.path["job_id"]))


def _path_id_of(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 18:
        raise Refused(f"invalid job id {raw!r}")
    return int(raw)
