"""One node of a running step, for srun outside the job (spurcloud/api/steps.py has the
step's own routes and what they share): srun attaches to a node's stream again, writes
its input, resizes its terminal and signals its tasks there, each with the step's I/O
credential for that node (the controller made it; the step's first line gave it).

    POST .../steps/{step}/attach   {"node", "io", "offsets": [[rank, out, err]]}: that
                                   node's stream again, from those offsets
    POST .../steps/{step}/input    {"node", "io", "offset", "data", "eof"}: a piece of
                                   srun's input; {"written", "eof"}
    POST .../steps/{step}/resize   {"node", "io", "cols", "rows"} (--pty)
    POST .../steps/{step}/signal   {"node", "io", "signal"}: to its tasks there

The web sends them only to the job's own nodes, at the agent URLs the controller knows
(tenants never learn them); what the agent answers is the answer (a refused I/O
credential is a 403 here, a 401 being the API token's). Input, resizes and signals count
against their own rate limit (`API_STEP_IO_PER_MINUTE_PER_TOKEN`), not the token's for
everything else: a keystroke is one, and so is each piece of a piped file.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
from django.http import Http404, StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from scheduler.core.contract import MAX_SIGNAL, MIN_SIGNAL
from scheduler.core.contract.steps import MAX_PTY_SIZE, MAX_STEP_INPUT_CHUNK, MAX_STEP_TASKS
from scheduler.rpc.errors import NotFound
from spurcloud.api import throttling
from spurcloud.api.authentication import request_token, request_user
from spurcloud.api.nodes import NODE_NAME_PATTERN
from spurcloud.api.serializers import ClosedSerializer
from spurcloud.api.steps import (
    CALL_TIMEOUT_S,
    MAX_INPUT_TEXT,
    NDJSON,
    STREAM_TIMEOUT_S,
    agent_url,
    detail_of,
    may_act,
    ndjson_line,
    open_stream,
)
from spurcloud.api.views import AUTH, BAD, ClosedQueryApi
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import Organization, Scope


class StepIoThrottle(throttling.PerMinuteThrottle):
    """A step's input, resizes and signals, by token: a keystroke or a piece of a piped
    file each, counted apart from the token's other requests."""

    scope = "step_io"
    setting = "API_STEP_IO_PER_MINUTE_PER_TOKEN"

    def ident(self, request: Request, view: Any) -> str | None:
        token = request.auth
        return None if token is None else str(getattr(token, "pk", token))

    def refusal(self) -> str:
        return f"Too many step input requests with this API token (at most {self.limit} a minute)."


class NodeSerializer(ClosedSerializer):
    node = serializers.RegexField(
        rf"^{NODE_NAME_PATTERN}$", help_text="The node, as the step named it."
    )
    io = serializers.CharField(
        max_length=400,
        trim_whitespace=False,
        help_text="The step's I/O credential there, as the step gave it.",
    )


class AttachSerializer(NodeSerializer):
    offsets = serializers.ListField(
        child=serializers.ListField(
            child=serializers.IntegerField(min_value=0, max_value=2**62),
            min_length=3,
            max_length=3,
        ),
        max_length=MAX_STEP_TASKS,
        required=False,
        help_text="[[rank, stdout bytes, stderr bytes]] already received.",
    )  # fmt: skip


class InputSerializer(NodeSerializer):
    offset = serializers.IntegerField(min_value=0, max_value=2**62)
    # The serializer's metaclass takes the field out of the class: `.data` stays DRF's.
    data = serializers.CharField(  # type: ignore[assignment]
        max_length=MAX_INPUT_TEXT,
        allow_blank=True,
        trim_whitespace=False,
        required=False,
        help_text=f"Base64, at most {MAX_STEP_INPUT_CHUNK} bytes.",
    )
    eof = serializers.BooleanField(required=False, default=False)


class ResizeSerializer(NodeSerializer):
    cols = serializers.IntegerField(min_value=1, max_value=MAX_PTY_SIZE)
    rows = serializers.IntegerField(min_value=1, max_value=MAX_PTY_SIZE)


class SignalSerializer(NodeSerializer):
    signal = serializers.IntegerField(min_value=MIN_SIGNAL, max_value=MAX_SIGNAL)


STEP_IO_ERRORS = {
    **BAD,
    **AUTH,
    403: OpenApiResponse(
        description="The token lacks the scope, a member acted on another's job, or the "
        "step's I/O credential is not that node's for this step."
    ),
    404: OpenApiResponse(description="No such job or node of it, or the step left the node."),
    409: OpenApiResponse(description="The agent's refusal (input: `written`, where it is)."),
    503: OpenApiResponse(description="The node's agent (or the scheduler) is unreachable."),
}


class _NodeApi(ClosedQueryApi):
    """One request for one node of a step, carried to its agent with the I/O credential
    the client holds: what the agent answers is the answer."""

    required_scopes = {"POST": Scope.JOBS}
    serializer: type[NodeSerializer] = NodeSerializer
    operation = ""

    def get_throttles(self) -> list[BaseThrottle]:
        return [StepIoThrottle()]

    def node_url(self, request: Request, job_id: int, step_id: int) -> tuple[dict[str, Any], str]:
        body = self.serializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        organization = request_token(request).organization
        record = may_act(organization, request_user(request), job_id)
        if data["node"] not in _job_nodes(record, organization):
            raise Http404(f"Job {job_id} has no node {data['node']}.")
        try:
            base = agent_url(data["node"])
        except NotFound as exc:
            raise Http404(exc.message) from exc
        return data, f"{base.rstrip('/')}/v1/jobs/{job_id}/steps/{step_id}/{self.operation}"

    def carry(self, request: Request, job_id: int, step_id: int, body: dict[str, Any]) -> Any:
        data, url = self.node_url(request, job_id, step_id)
        try:
            answer = _agents().post(url, json=body, timeout=CALL_TIMEOUT_S,
                                    headers={"Authorization": f"Bearer {data['io']}"})  # fmt: skip
        except httpx.HTTPError as exc:
            return Response({"detail": f"node {data['node']} is unreachable: {exc}",
                             "code": "unavailable"}, status=503)  # fmt: skip
        return _passed(answer)


_client: httpx.Client | None = None
_client_lock = threading.Lock()


def _agents() -> httpx.Client:
    """One client for the web process's calls to the agents, its connections kept: a
    piece of input each keystroke must not pay a new TCP connection."""
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(timeout=CALL_TIMEOUT_S)
        return _client


def _job_nodes(record: JobRecord, organization: Organization) -> list[str]:
    """The job's nodes: the history's, or (its start not yet mirrored there, as when a
    step starts the moment its job runs) the controller's."""
    if record.nodes:
        return [str(n) for n in record.nodes]
    try:
        job = controller_client().job(record.job_id, tenant=organization.slug)
    except NotFound:
        return []
    return [str(n) for n in job.get("nodes") or ()]


def _passed(answer: httpx.Response) -> Response:
    """The agent's answer as the web's: a refused I/O credential is a 403 here (a 401 is
    the API token's), an agent's failure a 503."""
    try:
        content = answer.json()
    except ValueError:
        content = {"detail": answer.text[:500], "code": "error"}
    status = answer.status_code
    if status == 401:
        status = 403
    elif status >= 500:
        status = 503
    return Response(content, status=status)


class StepAttachApi(_NodeApi):
    serializer = AttachSerializer
    operation = "attach"

    def get_throttles(self) -> list[BaseThrottle]:
        return ClosedQueryApi.get_throttles(self)

    @extend_schema(
        operation_id="jobs_steps_attach",
        summary="A node's stream of a running step again, from the bytes already received",
        request=AttachSerializer,
        responses={200: OpenApiResponse(description="application/x-ndjson"), **STEP_IO_ERRORS},
    )
    def post(self, request: Request, job_id: int, step_id: int) -> Any:
        data, url = self.node_url(request, job_id, step_id)
        body = {"offsets": data.get("offsets", [])}
        response = StreamingHttpResponse(
            _attached(url, body, data["io"], data["node"]), content_type=NDJSON
        )
        response["Cache-Control"] = "no-store"
        return response


async def _attached(url: str, body: dict[str, Any], io: str, node: str) -> AsyncIterator[bytes]:
    """The node's stream, each event named with its node; the agent's refusal as an
    `error` (for good) or a `lost` (its agent does not answer yet: try again)."""
    async with httpx.AsyncClient(timeout=STREAM_TIMEOUT_S) as client:
        try:
            response = await open_stream(client, url, body, io, retry=False)
        except httpx.HTTPError as exc:
            yield ndjson_line({"node": node, "lost": f"node {node} is unreachable: {exc}"})
            return
        try:
            if response.status_code >= 500:
                yield ndjson_line({"node": node, "lost": await detail_of(response)})
                return
            if response.status_code >= 400:
                yield ndjson_line({"node": node, "error": await detail_of(response)})
                return
            async for raw in response.aiter_lines():
                if raw:
                    yield ndjson_line({**json.loads(raw), "node": node})
        except (httpx.HTTPError, ValueError) as exc:
            yield ndjson_line({"node": node, "lost": f"lost the connection to node {node}: {exc}"})
        finally:
            await response.aclose()


class StepInputApi(_NodeApi):
    serializer = InputSerializer
    operation = "input"

    @extend_schema(
        operation_id="jobs_steps_input",
        summary="A piece of srun's input to a node's tasks of a running step",
        request=InputSerializer,
        responses={200: OpenApiResponse(description='{"written", "eof"}'), **STEP_IO_ERRORS},
    )
    def post(self, request: Request, job_id: int, step_id: int) -> Any:
        data = request.data if isinstance(request.data, dict) else {}
        body: dict[str, Any] = {k: data.get(k) for k in ("offset", "data", "eof") if k in data}
        return self.carry(request, job_id, step_id, body)


class StepResizeApi(_NodeApi):
    serializer = ResizeSerializer
    operation = "resize"

    @extend_schema(
        operation_id="jobs_steps_resize",
        summary="The window size of a running step's terminal (srun --pty)",
        request=ResizeSerializer,
        responses={200: OpenApiResponse(description="{}"), **STEP_IO_ERRORS},
    )
    def post(self, request: Request, job_id: int, step_id: int) -> Any:
        data = request.data if isinstance(request.data, dict) else {}
        return self.carry(request, job_id, step_id, {k: data.get(k) for k in ("cols", "rows")})


class StepSignalApi(_NodeApi):
    serializer = SignalSerializer
    operation = "signal"

    @extend_schema(
        operation_id="jobs_steps_signal",
        summary="A signal srun received, to a node's tasks of a running step",
        request=SignalSerializer,
        responses={200: OpenApiResponse(description='{"delivered"}'), **STEP_IO_ERRORS},
    )
    def post(self, request: Request, job_id: int, step_id: int) -> Any:
        data = request.data if isinstance(request.data, dict) else {}
        return self.carry(request, job_id, step_id, {"signal": data.get("signal")})


__all__ = ["StepAttachApi", "StepInputApi", "StepIoThrottle", "StepResizeApi", "StepSignalApi"]
