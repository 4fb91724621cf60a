"""Job steps through the web API, for a job's owner outside its sandbox (docs/architecture.md,
"Job steps"): `salloc`'s command and `srun` outside an allocation run steps here.

    POST /api/v1/jobs/{id}/steps                a step of a running job; the answer streams
                                                (application/x-ndjson): first {"step_id",
                                                "nodes", "tasks": [[rank, node]], "io":
                                                {node: the step's I/O credential there}},
                                                then the agents' events, each with its
                                                "node"; {"node", "lost"} when the web lost a
                                                node's stream (attach to it again)
    POST .../steps/{step}/attach, input,        one node of the step, again
         resize, signal                         (spurcloud/api/step_nodes.py)
    POST .../steps/{step}/end                   {"exit_code", "signal"}: how it ended, from
                                                an srun that had to attach again
    POST .../steps/{step}/cancel                scancel N.S; body {"signal": n?}

Who may: the job's own user, or an owner or admin of its organisation (a member acting on
another's job: 403); another organisation's job is a 404, as for every job route. The
controller plans, records and signs the step (scheduler/ctld/steps.py) and makes its
I/O credentials; the web carries the signed launches and every later request to the
agents (which tenants never reach: their URLs stay here), and records the step's end
when its own stream saw every task end. The agent checks the I/O credential (one step
of one job attempt on one node).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from django.core.exceptions import PermissionDenied
from django.http import Http404, StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from scheduler.core.contract import MAX_SIGNAL
from scheduler.core.contract.steps import (
    MAX_PTY_SIZE,
    MAX_STEP_INPUT_CHUNK,
    MAX_STEP_TASKS,
    STEP_INPUT_MODES,
)
from scheduler.rpc.errors import NotFound
from spurcloud.api.authentication import request_token, request_user
from spurcloud.api.serializers import ClosedSerializer, JobCancelSerializer
from spurcloud.api.views import (
    AUTH,
    BAD,
    CONFLICT,
    DOWN,
    FORBIDDEN,
    MISSING,
    ClosedQueryApi,
)
from spurcloud.jobs import jobobject
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.errors import job_not_found_message
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.selectors import access_job
from spurcloud.tenants.models import Membership, Organization, Scope

log = logging.getLogger(__name__)

STREAM_TIMEOUT_S = httpx.Timeout(30.0, read=None)
CALL_TIMEOUT_S = httpx.Timeout(30.0)
LAUNCH_RETRY_S = 5.0  # an agent that does not answer the launch yet (it is restarting)
NODE_URLS_TTL_S = 10.0
MAX_INPUT_TEXT = (MAX_STEP_INPUT_CHUNK * 4) // 3 + 4  # a piece of input, base64
NDJSON = "application/x-ndjson"


def may_act(organization: Organization, user: Any, job_id: int) -> JobRecord:
    """The job, if this is its own user or an owner or admin of its organisation; 404
    for another organisation's job."""
    membership = Membership.objects.filter(organization=organization, user=user).first()
    if membership is None:
        raise PermissionDenied("You are not a member of this organisation.")
    record = access_job(organization=organization, job_id=job_id)
    if not membership.manages_organization and record.user != user.get_username():
        raise PermissionDenied("You can run steps only in your own jobs.")
    return record


_node_urls: dict[str, str] = {}
_node_urls_at = 0.0
_node_urls_lock = threading.Lock()


def agent_url(node: str) -> str:
    """Where the web reaches a node's agent (the controller's node list, read again every
    NODE_URLS_TTL_S: a piece of input per keystroke must not cost a controller call)."""
    global _node_urls_at
    with _node_urls_lock:
        fresh = time.monotonic() - _node_urls_at < NODE_URLS_TTL_S
        url = _node_urls.get(node) if fresh else None
    if url:
        return url
    found = {str(n["name"]): str(n.get("agent_url") or "") for n in controller_client().nodes()}
    with _node_urls_lock:
        _node_urls.clear()
        _node_urls.update(found)
        _node_urls_at = time.monotonic()
    if not found.get(node):
        raise NotFound(f"node {node} is not registered")
    return found[node]


# -- the step's stream --------------------------------------------------------------------


@extend_schema_field({"oneOf": [{"type": "string", "enum": list(STEP_INPUT_MODES)},
                                {"type": "integer", "minimum": 0}]})  # fmt: skip
class StepInputField(serializers.Field[Any, Any, Any, Any]):
    """srun's -i: "all" (Slurm's default), "none", or the rank of the one task reading it."""

    def to_internal_value(self, data: Any) -> Any:
        if data in STEP_INPUT_MODES:
            return data
        if isinstance(data, int) and not isinstance(data, bool) and 0 <= data < MAX_STEP_TASKS:
            return data
        raise serializers.ValidationError('"all", "none" or a task rank.')

    def to_representation(self, value: Any) -> Any:
        return value


class StepRequestSerializer(serializers.Serializer[Any]):
    argv = serializers.ListField(
        child=serializers.CharField(allow_blank=True, max_length=65536, trim_whitespace=False),
        min_length=1,
        max_length=4096,
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=131072, trim_whitespace=False),
        required=False,
    )
    cwd = serializers.CharField(required=False, allow_blank=True, max_length=4096)
    name = serializers.CharField(required=False, allow_blank=True, max_length=200)
    nodes = serializers.IntegerField(required=False, min_value=1, max_value=4096)
    ntasks = serializers.IntegerField(required=False, min_value=1, max_value=4096)
    ntasks_per_node = serializers.IntegerField(required=False, min_value=1, max_value=4096)
    cpus_per_task = serializers.IntegerField(required=False, min_value=1, max_value=100000)
    gpus_per_task = serializers.IntegerField(required=False, min_value=0, max_value=1024)
    cpu_bind = serializers.ChoiceField(choices=["none", "cores"], required=False)
    input = StepInputField(required=False, help_text="Who reads srun's stdin (srun -i).")
    pty = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=MAX_PTY_SIZE),
        min_length=2,
        max_length=2,
        required=False,
        help_text="srun --pty: task 0 runs on a terminal of [columns, rows].",
    )


class _Relay:
    """The step's launches carried to its agents, their streams merged for the client.

    An async iterator: Django serves a synchronous one only once it has read it whole
    (`sync_to_async(list)` under ASGI), and a step's stream must flow while the step
    runs (its input waits on its output). A client that goes away cancels it."""

    def __init__(self, job_id: int, tenant: str, answer: dict[str, Any]) -> None:
        self.job_id, self.tenant = job_id, tenant
        self.launches: list[dict[str, Any]] = answer["launches"]
        self.step_id = int(answer["step_id"])

    def first(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "nodes": [launch["node"] for launch in self.launches],
            "tasks": [
                [task[0], launch["node"]]
                for launch in self.launches
                for task in launch["payload"]["step"]["tasks"]
            ],
            "io": {launch["node"]: launch["io"] for launch in self.launches},
        }

    async def pump(
        self,
        client: httpx.AsyncClient,
        launch: dict[str, Any],
        events: asyncio.Queue[dict[str, Any] | None],
    ) -> None:
        """One node: the launch (again while its agent does not answer yet; an attach
        when it was launched but its answer lost), then its stream. A refusal: `error`;
        a stream that broke: `lost`, and the client attaches to it again. The queue is
        bounded: a client that reads slowly slows the agents' streams, not the web."""
        node = launch["node"]
        base = f"{launch['agent_url'].rstrip('/')}/v1/jobs/{self.job_id}/steps"
        left = len(launch["payload"]["step"]["tasks"])
        try:
            try:
                response = await open_stream(client, base, launch["payload"], None, retry=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never delivered
                await events.put({"node": node, "error": f"node {node} is unreachable: {exc}"})
                return
            if response.status_code == 409 and await _code(response) == "step_launched":
                await response.aclose()
                attach = f"{base}/{self.step_id}/attach"
                response = await open_stream(client, attach, {}, launch["io"], retry=True)
            if response.status_code >= 400:
                await events.put({"node": node, "error": await detail_of(response)})
                await response.aclose()
                return
            try:
                async for raw in response.aiter_lines():
                    if raw:
                        event = json.loads(raw)
                        left -= "x" in event
                        await events.put({**event, "node": node})
            finally:
                await response.aclose()
            if left > 0:
                await events.put({"node": node, "lost": "its stream ended before its tasks"})
        except httpx.TransportError as exc:
            await events.put({"node": node, "lost": f"lost the connection to node {node}: {exc}"})
        except (httpx.HTTPError, ValueError) as exc:
            await events.put({"node": node, "error": f"node {node}: {exc}"})
        finally:
            await events.put(None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The first line, then every agent's events, merged; records the step's end
        when every node ended or was refused (else srun, attaching again, records it)."""
        yield ndjson_line(self.first())
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=64)
        client = httpx.AsyncClient(timeout=STREAM_TIMEOUT_S)
        pumps = [asyncio.create_task(self.pump(client, launch, events)) for launch in self.launches]
        exit_code, signal, running, whole = 0, 0, len(self.launches), False
        try:
            while running:
                event = await events.get()
                if event is None:
                    running -= 1
                    continue
                if "error" in event:
                    exit_code = max(exit_code, 1)
                if "x" in event:
                    exit_code = max(exit_code, int(event["x"]))
                    signal = max(signal, int(event.get("s") or 0))
                if "lost" in event:
                    exit_code = -1  # srun follows that node on its own: it records the end
                yield ndjson_line(event)
            whole = exit_code >= 0
        finally:
            for pump in pumps:  # a client gone away: the agents' streams close
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await client.aclose()
            if whole:
                await asyncio.to_thread(self._record_end, exit_code, signal)

    def _record_end(self, exit_code: int, signal: int) -> None:
        try:
            controller_client().end_step(
                self.job_id,
                self.step_id,
                tenant=self.tenant,
                exit_code=0 if signal else min(exit_code, 255),
                signal=signal,
            )
        except Exception:
            log.exception("the end of step %s.%s was not recorded", self.job_id, self.step_id)


async def open_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], io: str | None, *, retry: bool
) -> httpx.Response:
    """A streamed POST to an agent; while `retry`, again for LAUNCH_RETRY_S while the
    agent does not answer (it is restarting)."""
    headers = {"Authorization": f"Bearer {io}"} if io else {}
    deadline = time.monotonic() + LAUNCH_RETRY_S
    while True:
        try:
            request = client.build_request("POST", url, json=body, headers=headers)
            return await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            if not retry or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _code(response: httpx.Response) -> str:
    await response.aread()
    try:
        return str(response.json().get("code", ""))
    except ValueError:
        return ""


async def detail_of(response: httpx.Response) -> str:
    await response.aread()
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text


def ndjson_line(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, separators=(",", ":")) + "\n").encode()


class StepsApi(ClosedQueryApi):
    required_scopes = {"POST": Scope.JOBS}

    @extend_schema(
        operation_id="jobs_steps_create",
        summary="Run a job step in a running job, streaming its tasks' output",
        request=StepRequestSerializer,
        responses={
            200: OpenApiResponse(
                description="application/x-ndjson: the step, then its tasks' events"
            ),
            **BAD,
            **AUTH,
            **FORBIDDEN,
            **MISSING,
            **CONFLICT,
            **DOWN,
        },
    )
    def post(self, request: Request, job_id: int) -> Any:
        body = StepRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        organization = request_token(request).organization
        may_act(organization, request_user(request), job_id)
        try:
            answer = controller_client().create_step(
                job_id, dict(body.validated_data), tenant=organization.slug
            )
        except NotFound as exc:
            raise Http404(job_not_found_message(job_id)) from exc
        response = StreamingHttpResponse(
            aiter(_Relay(job_id, organization.slug, answer)), content_type=NDJSON
        )
        response["Cache-Control"] = "no-store"
        return response


class EndSerializer(ClosedSerializer):
    exit_code = serializers.IntegerField(min_value=0, max_value=255)
    signal = serializers.IntegerField(min_value=0, max_value=MAX_SIGNAL, default=0)


class StepEndApi(ClosedQueryApi):
    required_scopes = {"POST": Scope.JOBS}

    @extend_schema(
        operation_id="jobs_steps_end",
        summary="How a step ended, from srun (when the web's own stream did not see it)",
        request=EndSerializer,
        responses={
            200: OpenApiResponse(description="{}"),
            **BAD,
            **AUTH,
            **FORBIDDEN,
            **MISSING,
            **CONFLICT,
            **DOWN,
        },
    )
    def post(self, request: Request, job_id: int, step_id: int) -> Response:
        body = EndSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        organization = request_token(request).organization
        may_act(organization, request_user(request), job_id)
        try:
            controller_client().end_step(
                job_id, step_id, tenant=organization.slug, **body.validated_data
            )
        except NotFound as exc:
            raise Http404(job_not_found_message(job_id)) from exc
        return Response({})


class StepCancelApi(ClosedQueryApi):
    required_scopes = {"POST": Scope.JOBS}

    @extend_schema(
        operation_id="jobs_steps_cancel",
        summary="Cancel one job step (scancel N.S)",
        request=JobCancelSerializer,
        responses={
            200: OpenApiResponse(description="The live job object."),
            **BAD,
            **AUTH,
            **FORBIDDEN,
            **MISSING,
            **CONFLICT,
            **DOWN,
        },
    )
    def post(self, request: Request, job_id: int, step_id: int) -> Response:
        body = JobCancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        signal = body.validated_data.get("signal")
        organization = request_token(request).organization
        may_act(organization, request_user(request), job_id)
        try:
            job = controller_client().cancel_step(
                job_id, step_id, tenant=organization.slug, signal=signal
            )
        except NotFound as exc:
            raise Http404(job_not_found_message(job_id)) from exc
        return Response(jobobject.from_controller(job))


__all__ = [
    "CALL_TIMEOUT_S",
    "MAX_INPUT_TEXT",
    "NDJSON",
    "STREAM_TIMEOUT_S",
    "StepCancelApi",
    "StepEndApi",
    "StepsApi",
    "agent_url",
    "detail_of",
    "may_act",
    "ndjson_line",
    "open_stream",
]
