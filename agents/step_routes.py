"""The agent's step routes (agents/steps.py): not behind the cluster token, which a job
does not hold; each checks its own credential before it reads anything further.

    POST /v1/jobs/{id}/steps                  a signed step launch (the controller's
                                              signature): the step's stream
                                              (agents/step_run.py)
    POST /v1/jobs/{id}/steps/{step}/attach    {"offsets": [[rank, out, err]]}: the
                                              stream again, from those offsets
    POST /v1/jobs/{id}/steps/{step}/input     {"offset", "data": base64, "eof"?}:
                                              {"written", "eof"}; 409 {"written"} when
                                              `offset` is not where the input has reached
    POST /v1/jobs/{id}/steps/{step}/resize    {"cols", "rows"}: {}; 409 with no terminal
    POST /v1/jobs/{id}/steps/{step}/signal    {"signal"}: {"delivered"}

All but the launch take the step's I/O credential for this node (`Authorization: Bearer
spur-stepio...`). It (scheduler/rpc/signatures.py, `step_io_token`) names one step of one
job attempt on this node; the controller gave it to whoever created the step. A launch
runs once (a replay is 409 `step_launched`); a piece of input is written once (a replay
is 409 `offset`); a piece larger than MAX_INPUT_CHUNK is 413.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import signal as signals
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agents.credentials import NodeCredential
from agents.launch_request import InvalidLaunch, LaunchError
from agents.step_io import MAX_INPUT_CHUNK
from agents.step_run import StepRun, parse_offsets
from agents.steps import StepRefused
from scheduler.core.contract.steps import MAX_PTY_SIZE
from scheduler.rpc import server as rpc
from scheduler.rpc import signatures
from scheduler.rpc.errors import Conflict, NotFound, Refused, Unauthorized, Unavailable

if TYPE_CHECKING:
    from agents.launcher import Launcher

log = logging.getLogger(__name__)

MAX_STEP_LAUNCH = 8 * 1024 * 1024
MAX_CONTROL = 64 * 1024  # an attach's offsets (4096 ranks), a resize, a signal
MAX_INPUT = (MAX_INPUT_CHUNK * 4) // 3 + 1024  # a piece of input, base64, in JSON
_MAX_SIGNAL = int(signals.SIGRTMAX)
NDJSON = "application/x-ndjson"


def routes(launcher: Launcher, credential: NodeCredential | None) -> list[Route]:
    def key() -> bytes:
        found = credential.key if credential is not None else None
        if found is None:
            raise Unavailable(f"node {launcher.node} takes no steps now: it has not registered")
        return found

    def step_of(request: Request) -> StepRun:
        """The step the request's I/O credential names, which must be the path's."""
        job_id = _path_int(request, "job_id")
        step_id = _path_int(request, "step_id")
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            raise Unauthorized("a step I/O credential is required")
        job, attempt, step = signatures.check_step_io_token(
            key(), header.removeprefix("Bearer "), node=launcher.node
        )
        if (job, step) != (job_id, step_id):
            raise Unauthorized("this step I/O credential is another step's")
        run = launcher.steps.find(job, attempt, step)
        if run is None:
            raise NotFound(f"step {job}.{step} does not run on node {launcher.node}")
        return run

    async def launch(request: Request) -> Response:
        """A step launch, from srun inside the job or the web: the controller's signature
        is checked before anything else."""
        job_id = _path_int(request, "job_id")
        body = await rpc.Call.of(request, MAX_STEP_LAUNCH).body()
        signatures.verify(key(), "step", signatures.step_launch_fields(body),
                          body.pop("signature", None), node=launcher.node,
                          now=time.time())  # fmt: skip
        if body.get("job_id") != job_id:
            raise Refused("job_id does not match the path")
        try:
            run = await run_in_threadpool(launcher.steps.start, body)
        except InvalidLaunch as exc:
            raise Refused(str(exc)) from exc
        except StepRefused as exc:
            raise Conflict(str(exc), code=exc.code) from exc
        except (LaunchError, OSError) as exc:
            log.exception("step of job %s failed to start on this node", job_id)
            line = json.dumps({"error": str(exc)}).encode() + b"\n"
            return StreamingResponse(iter([line]), media_type=NDJSON)
        return StreamingResponse(run.stream({}), media_type=NDJSON)

    async def attach(request: Request) -> Response:
        run = step_of(request)
        body = await rpc.Call.of(request, MAX_CONTROL).body()
        rpc.only(body, {"offsets"})
        offsets = parse_offsets(body.get("offsets", []))
        return StreamingResponse(run.stream(offsets), media_type=NDJSON)

    async def input_(request: Request) -> Response:
        run = step_of(request)
        body = await rpc.Call.of(request, MAX_INPUT).body()
        rpc.only(body, {"offset", "data", "eof"})
        offset = rpc.integer(body, "offset", low=0, high=1 << 62)
        text = body.get("data", "")
        if not isinstance(text, str):
            raise Refused("data must be base64 text")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise Refused("data must be base64 text") from None
        if len(data) > MAX_INPUT_CHUNK:
            raise Refused(f"a piece of input holds at most {MAX_INPUT_CHUNK} bytes",
                          code="too_large", status=413)  # fmt: skip
        return rpc.JsonResponse(await run.write_input(offset, data, rpc.boolean(body, "eof")))

    async def resize(request: Request) -> Response:
        run = step_of(request)
        body = await rpc.Call.of(request, MAX_CONTROL).body()
        rpc.only(body, {"cols", "rows"})
        cols = rpc.integer(body, "cols", low=1, high=MAX_PTY_SIZE)
        rows = rpc.integer(body, "rows", low=1, high=MAX_PTY_SIZE)
        run.resize(cols, rows)
        return rpc.JsonResponse({})

    async def signal(request: Request) -> Response:
        run = step_of(request)
        body = await rpc.Call.of(request, MAX_CONTROL).body()
        rpc.only(body, {"signal"})
        signum = rpc.integer(body, "signal", low=1, high=_MAX_SIGNAL)
        return rpc.JsonResponse({"delivered": await run_in_threadpool(run.signal, signum)})

    base = "/v1/jobs/{job_id}/steps"
    return [
        Route(base, _answering(launch), methods=["POST"]),
        Route(f"{base}/{{step_id}}/attach", _answering(attach), methods=["POST"]),
        Route(f"{base}/{{step_id}}/input", _answering(input_), methods=["POST"]),
        Route(f"{base}/{{step_id}}/resize", _answering(resize), methods=["POST"]),
        Route(f"{base}/{{step_id}}/signal", _answering(signal), methods=["POST"]),
    ]


def _answering(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The handler, its refusals answered as the RPC kit answers them."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            error = rpc.as_rpc_error(exc)
            if error is None:
                raise
            return rpc.error_response(error)

    return endpoint


def _path_int(request: Request, name: str) -> int:
    raw = str(request.path_params[name])
    if not raw.isdigit() or len(raw) > 18:
        raise Refused(f"invalid {name.replace('_', ' ')} {raw!r}")
    return int(raw)


__all__ = ["MAX_INPUT", "MAX_STEP_LAUNCH", "routes"]
