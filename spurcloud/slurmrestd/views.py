"""The slurmrestd routes: thin views over jobs.services and jobs.selectors, answering in
slurmrestd's shapes (jobinfo, cluster) with its envelope (envelope). Authentication,
scopes and rate limits are the tenant API's (`TenantApi`): read for GETs, jobs for submit
and cancel, and the organisation's submission limit on submit."""

from __future__ import annotations

import io
import re
import signal as signals
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import exception_handler

from scheduler.core.contract import MAX_SIGNAL, MIN_SIGNAL, JobAction
from scheduler.rpc.errors import Conflict, NotFound, Refused, RpcError, Unavailable
from spurcloud.api import throttling
from spurcloud.api.authentication import request_is_operator, request_token, request_user
from spurcloud.api.parsers import BoundedJSONParser
from spurcloud.api.views import TenantApi
from spurcloud.billing.errors import PaymentRequired
from spurcloud.jobs import jobobject, selectors, services
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.errors import JobRejected
from spurcloud.slurmrestd import cluster, envelope
from spurcloud.slurmrestd.auth import SlurmTokenAuthentication
from spurcloud.slurmrestd.envelope import SlurmError
from spurcloud.slurmrestd.jobdesc import check_spec, spec_error, translate_submit
from spurcloud.slurmrestd.jobinfo import job_info, number
from spurcloud.tenants.models import ApiToken, Scope

MAX_BODY = 16 * 1024 * 1024  # a 4 MB script, escaped, and its environment
MAX_QUERY_VALUE = 200
JOB_ID_RE = re.compile(r"^[0-9]{1,18}$")
QUERY_FLAGS = frozenset(
    ["ALL", "DETAIL", "MIXED", "LOCAL", "SIBLING", "FEDERATION", "FUTURE"]
)  # the query flags of GET jobs/nodes/partitions; accepted, all answers are complete
KILL_FLAGS = frozenset(
    [
        "BATCH_JOB",
        "ARRAY_TASK",
        "FULL_STEPS_ONLY",
        "FULL_JOB",
        "FEDERATION_REQUEUE",
        "HURRY",
        "OUT_OF_MEMORY",
        "NO_SIBLING_JOBS",
        "RESERVATION_JOB",
        "VERBOSE",
        "CRON_JOBS",
        "WARNING_SENT",
    ]
)


class SlurmJSONParser(BoundedJSONParser):
    """JSON bodies of at most MAX_BODY bytes (413 past it, read no further)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read(MAX_BODY + 1) if stream is not None else b""
        if len(raw) > MAX_BODY:
            raise SlurmError(
                413,
                envelope.ESLURM_REST_FAIL_PARSING,
                "Request body too large",
                f"The request body is larger than {MAX_BODY // (1024 * 1024)} MiB.",
                "#",
            )
        return super().parse(io.BytesIO(raw), media_type, parser_context)


def _status_error(status: int, detail: str) -> SlurmError:
    numbers = {
        401: envelope.SLURM_PROTOCOL_AUTHENTICATION_ERROR,
        403: envelope.ESLURM_ACCESS_DENIED,
        400: envelope.ESLURM_REST_FAIL_PARSING,
        415: envelope.ESLURM_REST_FAIL_PARSING,
    }
    return SlurmError(status, numbers.get(status, envelope.SLURM_ERROR), detail, detail)


def slurm_error(exc: Exception, response: Response | None) -> SlurmError | None:
    """The slurmrestd error of an exception a view raised (None: not a refusal)."""
    if isinstance(exc, SlurmError):
        return exc
    if isinstance(exc, JobRejected):
        return spec_error(exc.message, exc.field)
    if isinstance(exc, PaymentRequired):  # the organisation's prepaid credit is used up
        return SlurmError(402, envelope.ESLURM_ACCESS_DENIED, exc.message, exc.message)
    if isinstance(exc, Unavailable) and exc.status == 503:
        return SlurmError(
            503,
            envelope.SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR,
            "Unable to contact slurm controller (connect failure)",
            f"The scheduler is unreachable: {exc.message}",
        )
    if isinstance(exc, NotFound):
        return SlurmError(404, envelope.ESLURM_INVALID_JOB_ID, "Invalid job id specified")
    if isinstance(exc, Conflict):
        return SlurmError(
            409, envelope.ESLURM_ALREADY_DONE, "Job/step already completing or completed",
            exc.message,
        )  # fmt: skip
    if isinstance(exc, Refused):
        unavailable = exc.message.startswith("Requested node configuration")
        number_ = (
            envelope.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE
            if unavailable
            else envelope.ESLURM_REST_INVALID_JOBS_DESC
        )
        return SlurmError(400, number_, exc.message, exc.message)
    if isinstance(exc, RpcError):
        return SlurmError(
            502, envelope.SLURM_ERROR, "The scheduler answered with an error", exc.message
        )
    if response is not None:
        detail = getattr(exc, "detail", None) or str(exc) or "Error"
        if isinstance(detail, dict | list):
            detail = str(detail)
        return _status_error(response.status_code, str(detail))
    return None


class SlurmApi(TenantApi):
    """A slurmrestd route: the tenant API's authentication (plus X-SLURM-USER-TOKEN),
    scopes and rate limits; errors in slurmrestd's shape; no query parameter it does not
    take. Left out of the web API's own OpenAPI schema: its shapes are Slurm's."""

    schema = None
    authentication_classes = [SlurmTokenAuthentication]
    parser_classes = [SlurmJSONParser]
    query_parameters: ClassVar[Mapping[str, frozenset[str]]] = {}

    def version(self) -> str:
        return str(self.kwargs.get("version", "v0.0.42"))

    def empty(self) -> dict[str, Any]:
        """What an answer of this route must hold, even when it is an error."""
        return {}

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        method = (request.method or "").lower()
        if method != "options" and not hasattr(self, method):
            raise exceptions.MethodNotAllowed(request.method or "")  # before the scope check
        super().initial(request, *args, **kwargs)
        allowed = self.query_parameters.get(request.method or "", frozenset())
        unknown = sorted(set(request.query_params) - allowed)
        if unknown:
            raise SlurmError(
                400,
                envelope.ESLURM_REST_INVALID_QUERY,
                "Unknown query parameter",
                f"Unknown query parameter(s): {', '.join(unknown)[:300]}",
                "#/query",
            )
        for key, value in request.query_params.items():
            if len(value) > MAX_QUERY_VALUE:
                raise SlurmError(
                    400, envelope.ESLURM_REST_INVALID_QUERY, "Invalid query",
                    f"{key} is longer than {MAX_QUERY_VALUE} characters", f"#/query/{key}",
                )  # fmt: skip
        flags = request.query_params.get("flags")
        choices = KILL_FLAGS if request.method == "DELETE" else QUERY_FLAGS
        if flags is not None and flags.upper() not in choices:
            raise SlurmError(
                400, envelope.ESLURM_REST_INVALID_QUERY, "Invalid query",
                f"Unknown flag {flags!r}: one of {', '.join(sorted(choices))}", "#/query/flags",
            )  # fmt: skip

    def _identity(self) -> tuple[str, str]:
        """The caller's user and organisation, once authenticated."""
        token = getattr(self.request, "auth", None)
        if not isinstance(token, ApiToken):
            return "", ""
        return request_user(self.request).get_username(), token.organization.slug

    def answer(
        self, body: dict[str, Any], *, warnings: list[dict[str, str]] | None = None
    ) -> Response:
        user, group = self._identity()
        return Response(
            envelope.envelope(self.version(), body, warnings=warnings, user=user, group=group)
        )

    def get_exception_handler(self) -> Any:
        return self._handle_exception

    def _handle_exception(self, exc: Exception, context: dict[str, Any]) -> Response | None:
        if isinstance(exc, Http404):
            exc = exceptions.NotFound(str(exc) or "Not found.")
        elif isinstance(exc, DjangoPermissionDenied):
            exc = exceptions.PermissionDenied(str(exc) or None)
        response = exception_handler(exc, context)
        error = slurm_error(exc, response)
        if error is None:
            return None
        headers = {
            key: value
            for key, value in (response.items() if response is not None else ())
            if key in ("WWW-Authenticate", "Retry-After")
        }
        user, group = self._identity()
        body = envelope.envelope(
            self.version(),
            self.empty(),
            errors=[error.as_dict()],
            warnings=error.warnings,
            user=user,
            group=group,
        )
        return Response(body, status=error.status, headers=headers or None)


def _organization(request: Request) -> Any:
    return request_token(request).organization


def _job_id(text: str) -> int:
    if not JOB_ID_RE.match(text):
        raise SlurmError(404, envelope.ESLURM_INVALID_JOB_ID, "Invalid job id specified",
                         f"Invalid job id specified: {text[:40]!r}", "#/job_id")  # fmt: skip
    return int(text)


def _signal(text: str) -> int:
    """`SIGUSR2`, `USR2`, `usr2` or `12`, as scancel --signal takes it."""
    value = text.strip().upper()
    number_: int | None = None
    if value.isdigit():
        number_ = int(value)
    else:
        try:
            number_ = int(signals.Signals[value if value.startswith("SIG") else f"SIG{value}"])
        except KeyError:
            number_ = None
    if number_ is None or not MIN_SIGNAL <= number_ <= MAX_SIGNAL:
        raise SlurmError(
            400, envelope.ESLURM_REST_INVALID_QUERY, "Invalid job signal",
            f"Invalid job signal: {text[:40]!r}", "#/query/signal",
        )  # fmt: skip
    return number_


def _not_found_job(job_id: int) -> SlurmError:
    return SlurmError(
        404,
        envelope.ESLURM_INVALID_JOB_ID,
        "Invalid job id specified",
        f"Job {job_id} not found: Invalid job id specified",
        "#/job_id",
    )


class PingApi(SlurmApi):
    required_scopes = {"GET": Scope.READ}

    def empty(self) -> dict[str, Any]:
        return {"pings": []}

    def get(self, request: Request, version: str) -> Response:
        started = time.monotonic()
        try:
            answer: dict[str, Any] | None = controller_client().ping()
        except RpcError:
            answer = None
        latency = int((time.monotonic() - started) * 1_000_000)
        return self.answer({"pings": [cluster.ping(answer, latency)]})


class DiagApi(SlurmApi):
    required_scopes = {"GET": Scope.READ}

    def empty(self) -> dict[str, Any]:
        return {"statistics": {}}

    def get(self, request: Request, version: str) -> Response:
        jobs = selectors.live_queue(organization=_organization(request))
        return self.answer({"statistics": cluster.diag(jobs)})


def _update_time_warning(request: Request) -> list[dict[str, str]]:
    if "update_time" not in request.query_params:
        return []
    return [
        envelope.warning("update_time is not honoured: every item is listed", "#/query/update_time")
    ]


class JobsApi(SlurmApi):
    required_scopes = {"GET": Scope.READ}
    query_parameters = {"GET": frozenset({"update_time", "flags"})}

    def empty(self) -> dict[str, Any]:
        return {"jobs": [], "last_backfill": number(None), "last_update": number(None)}

    def get(self, request: Request, version: str) -> Response:
        jobs = selectors.live_queue(organization=_organization(request))
        return self.answer(
            {
                "jobs": [job_info(job) for job in jobs],
                "last_backfill": number(None),
                "last_update": number(int(time.time())),
            },
            warnings=_update_time_warning(request),
        )


class JobApi(SlurmApi):
    required_scopes = {"GET": Scope.READ, "DELETE": Scope.JOBS}
    query_parameters = {
        "GET": frozenset({"update_time", "flags"}),
        "DELETE": frozenset({"signal", "flags"}),
    }

    def empty(self) -> dict[str, Any]:
        if self.request is not None and self.request.method == "DELETE":
            return {"status": []} if self.version() == "v0.0.42" else {}
        return {"jobs": [], "last_backfill": number(None), "last_update": number(None)}

    def get(self, request: Request, version: str, job_id: str) -> Response:
        organization = _organization(request)
        number_ = _job_id(job_id)
        try:
            record = selectors.access_job(organization=organization, job_id=number_)
        except Http404:
            raise _not_found_job(number_) from None
        history = jobobject.from_record(record, tenant=organization.slug, with_spec=True)
        try:
            live = selectors.live_queue(
                organization=organization, ids=[number_], ended_window_s=float("inf")
            )
        except Unavailable:
            live = []  # the history still knows the job
        job = {**live[0], "spec": history["spec"]} if live else history
        return self.answer(
            {
                "jobs": [job_info(job)],
                "last_backfill": number(None),
                "last_update": number(int(time.time())),
            }
        )

    def delete(self, request: Request, version: str, job_id: str) -> Response:
        number_ = _job_id(job_id)
        text = request.query_params.get("signal")
        signal = _signal(text) if text is not None else None
        try:
            services.act_on_job(
                organization=_organization(request),
                user=request_user(request),
                job_id=number_,
                action=JobAction.CANCEL,
                signal=signal,
            )
        except Http404:
            raise _not_found_job(number_) from None
        body: dict[str, Any] = {}
        if self.version() == "v0.0.42":
            body["status"] = [
                {
                    "error": {"string": "No error", "code": 0, "message": ""},
                    "step_id": "batch" if signal else "",
                    "job_id": number(number_),
                    "federation": {"sibling": ""},
                }
            ]
        return self.answer(body)


class SubmitApi(SlurmApi):
    required_scopes = {"POST": Scope.JOBS}

    def get_throttles(self) -> list[BaseThrottle]:
        return [*super().get_throttles(), throttling.OrganizationSubmitThrottle()]

    def post(self, request: Request, version: str) -> Response:
        translation = translate_submit(request.data)
        spec = check_spec(translation)
        job = services.submit_job(
            organization=_organization(request),
            user=request_user(request),
            spec=spec,
            idempotency_key=request.headers.get("Idempotency-Key", "")[:200],
            operator=request_is_operator(request),
        )
        job_id = int(job["job_id"])
        return self.answer(
            {
                "job_id": job_id,
                "step_id": "batch",
                "job_submit_user_msg": "",
                "result": {
                    "job_id": job_id,
                    "step_id": "batch",
                    "error_code": 0,
                    "error": "",
                    "job_submit_user_msg": "",
                },
            },
            warnings=translation.warnings,
        )


class NodesApi(SlurmApi):
    required_scopes = {"GET": Scope.READ}
    query_parameters = {"GET": frozenset({"update_time", "flags"})}

    def empty(self) -> dict[str, Any]:
        return {"nodes": [], "last_update": number(None)}

    def get(self, request: Request, version: str, node_name: str | None = None) -> Response:
        nodes = [cluster.node(n) for n in selectors.cluster_nodes()]
        if node_name is not None:
            nodes = [n for n in nodes if n["name"] == node_name]
            if not nodes:
                raise SlurmError(
                    404, envelope.ESLURM_INVALID_NODE_NAME, "Invalid node name specified",
                    f"Invalid node name specified: {node_name!r}", "#/node_name",
                )  # fmt: skip
        return self.answer(
            {"nodes": nodes, "last_update": number(int(time.time()))},
            warnings=_update_time_warning(request),
        )


class PartitionsApi(SlurmApi):
    required_scopes = {"GET": Scope.READ}
    query_parameters = {"GET": frozenset({"update_time", "flags"})}

    def empty(self) -> dict[str, Any]:
        return {"partitions": [], "last_update": number(None)}

    def get(self, request: Request, version: str, partition_name: str | None = None) -> Response:
        nodes = selectors.cluster_nodes()
        parts = [cluster.partition(p, nodes) for p in selectors.cluster_partitions()]
        if partition_name is not None:
            parts = [p for p in parts if p["name"] == partition_name]
            if not parts:
                raise SlurmError(
                    404, envelope.ESLURM_INVALID_PARTITION_NAME, "Invalid partition name specified",
                    f"Invalid partition name specified: {partition_name!r}", "#/partition_name",
                )  # fmt: skip
        return self.answer(
            {"partitions": parts, "last_update": number(int(time.time()))},
            warnings=_update_time_warning(request),
        )


@csrf_exempt
def not_found(request: HttpRequest, version: str = "v0.0.42", **kwargs: Any) -> JsonResponse:
    """Any other path under /slurm/: slurmrestd's 404, in its shape."""
    body = envelope.envelope(
        version,
        {},
        errors=[
            SlurmError(
                404,
                envelope.SLURM_ERROR,
                "Unable to find query",
                f"Unable to find query for {request.method} {request.path[:200]}: this cluster "
                f"serves {', '.join(envelope.VERSIONS)}",
                request.path[:200],
            ).as_dict()
        ],
    )
    return JsonResponse(body, status=404)
