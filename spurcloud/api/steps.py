"""Job steps through the web API, for a job's owner outside its sandbox (docs/architecture.md,
"Job steps"): `salloc`'s command and `srun` outside an allocation run steps here.

    POST /api/v1/jobs/{id}/steps              a step of a running job; the answer streams
                                              (application/x-ndjson): first
                                              {"step_id", "nodes", "tasks": [[rank, node]]},
                                              then the agents' events, each with its "node"
    POST /api/v1/jobs/{id}/steps/{step}/cancel scancel N.S; body {"signal": n?}

Who may: the job's own user, or an owner or admin of its organisation (a member acting on
another's job: 403); another organisation's job is a 404, as for every job route. The
controller plans, records and signs the step (scheduler/ctld/steps.py); the web carries
the signed launches to the agents (which tenants never reach) and records the step's end.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import httpx
from django.core.exceptions import PermissionDenied
from django.http import Http404, StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from scheduler.rpc.errors import NotFound
from spurcloud.api.authentication import request_token, request_user
from spurcloud.api.serializers import JobCancelSerializer
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
from spurcloud.jobs.selectors import access_job
from spurcloud.tenants.models import Membership, Organization, Scope

log = logging.getLogger(__name__)

STREAM_TIMEOUT_S = httpx.Timeout(30.0, read=None)


def _may_act(organization: Organization, user: Any, job_id: int) -> None:
    """The job's own user, or an owner or admin of its organisation; 404 for another
    organisation's job."""
    membership = Membership.objects.filter(organization=organization, user=user).first()
    if membership is None:
        raise PermissionDenied("You are not a member of this organisation.")
    record = access_job(organization=organization, job_id=job_id)
    if not membership.manages_organization and record.user != user.get_username():
        raise PermissionDenied("You can run steps only in your own jobs.")


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
    stdin = serializers.CharField(
        required=False, allow_blank=True, max_length=1398104, help_text="Task 0's stdin, base64."
    )


def _relay(job_id: int, tenant: str, answer: dict[str, Any]) -> Iterator[bytes]:
    """The step's first line, then every agent's events (tagged with the node), merged;
    records the step's end once all are in, or when the client goes away."""
    launches = answer["launches"]
    step_id = int(answer["step_id"])
    yield _line(
        {
            "step_id": step_id,
            "nodes": [launch["node"] for launch in launches],
            "tasks": [
                [task[0], launch["node"]]
                for launch in launches
                for task in launch["payload"]["step"]["tasks"]
            ],
        }
    )
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    client = httpx.Client(timeout=STREAM_TIMEOUT_S)

    def pump(launch: dict[str, Any]) -> None:
        node = launch["node"]
        url = f"{launch['agent_url'].rstrip('/')}/v1/jobs/{job_id}/steps"
        try:
            with client.stream("POST", url, json=launch["payload"]) as response:
                if response.status_code >= 400:
                    response.read()
                    detail = response.json().get("detail", response.text)
                    events.put({"node": node, "error": str(detail)})
                    return
                for raw in response.iter_lines():
                    if raw:
                        events.put({**json.loads(raw), "node": node})
        except (httpx.HTTPError, ValueError) as exc:
            events.put({"node": node, "error": f"lost the connection to node {node}: {exc}"})
        finally:
            events.put(None)

    for launch in launches:
        threading.Thread(target=pump, args=(launch,), daemon=True).start()
    exit_code, signal = 0, 0
    running = len(launches)
    try:
        while running:
            event = events.get()
            if event is None:
                running -= 1
                continue
            if "error" in event:
                exit_code = max(exit_code, 1)
            if "x" in event:
                exit_code = max(exit_code, int(event["x"]))
                signal = max(signal, int(event.get("s") or 0))
            yield _line(event)
    finally:
        client.close()  # a client gone away: the agents' streams close, the tasks die
        try:
            controller_client().end_step(
                job_id,
                step_id,
                tenant=tenant,
                exit_code=0 if signal else min(exit_code, 255),
                signal=signal,
            )
        except Exception:
            log.exception("the end of step %s.%s was not recorded", job_id, step_id)


def _line(value: dict[str, Any]) -> bytes:
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
        _may_act(organization, request_user(request), job_id)
        try:
            answer = controller_client().create_step(
                job_id, dict(body.validated_data), tenant=organization.slug
            )
        except NotFound as exc:
            raise Http404(job_not_found_message(job_id)) from exc
        response = StreamingHttpResponse(
            _relay(job_id, organization.slug, answer), content_type="application/x-ndjson"
        )
        response["Cache-Control"] = "no-store"
        return response


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
        _may_act(organization, request_user(request), job_id)
        try:
            job = controller_client().cancel_step(
                job_id, step_id, tenant=organization.slug, signal=signal
            )
        except NotFound as exc:
            raise Http404(job_not_found_message(job_id)) from exc
        return Response(jobobject.from_controller(job))


__all__ = ["StepCancelApi", "StepsApi"]
