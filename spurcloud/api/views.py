"""The tenant API v1 (docs/architecture.md, "Web API"). One view per operation; each reads
the organisation from the token (`request.auth.organization`), validates its input with
a serializer built from the job contract, and calls one service or selector. Each says
which token scope each of its methods needs, and counts against the rate limits
(`TenantApi`). Every answer it can give, errors included, is in its schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from scheduler.core.contract import JOB_FIELDS, JobAction
from scheduler.core.contract.job_object import COLUMN_SHAPES, FIELD_NAMES, SHAPES
from scheduler.rpc.errors import RpcError, Unavailable
from spurcloud.api import throttling
from spurcloud.api.authentication import request_is_operator, request_token, request_user
from spurcloud.api.pagination import JobHistoryPagination, unpaginated
from spurcloud.api.query_fields import (
    MAX_ID,
    STATES_HELP,
    CommaFields,
    CommaIntegers,
    CommaNames,
    CommaStates,
)
from spurcloud.api.serializers import (
    ErrorSerializer,
    JobCancelSerializer,
    JobColumnsSerializer,
    JobOutputSerializer,
    JobSerializer,
    JobSpecSerializer,
    ListedJobSerializer,
    ListedLiveJobSerializer,
    LiveJobColumnsSerializer,
    LiveJobSerializer,
    NodeSerializer,
    PartitionSerializer,
)
from spurcloud.jobs import jobobject, kept, selectors, services
from spurcloud.jobs.jobobject import HISTORY_FIELDS
from spurcloud.tenants.models import Organization, Scope


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


BAD = {400: _error("Refused, with the reason (and the field at fault).")}
# What every operation can answer before it runs (TenantApi): the token, its scope, the
# rate limits (429 with Retry-After, which spurcloud/api/schema.py adds to the schema).
AUTH = {
    401: _error(
        "Bad, missing, revoked or expired token, or its user has not confirmed their email."
    ),
    403: _error("The token lacks the scope this operation needs."),
    429: _error("Too many requests: Retry-After says in how many seconds to try again."),
}
DOWN = {503: _error("The scheduler is unreachable.")}
MISSING = {404: _error("No such job here (or another organisation's: the same answer).")}
FORBIDDEN = {
    403: _error(
        "The token lacks the scope this operation needs, or a member acted on another's job."
    )
}
CONFLICT = {409: _error("Not now: the job's state does not allow it (e.g. hold a running job).")}


def _results_of(serializer: type[serializers.Serializer[Any]], name: str) -> Any:
    return inline_serializer(
        name=name,
        fields={
            "results": serializer(many=True),
            "next": serializers.URLField(allow_null=True),
        },
    )


SHAPE_HELP = (
    "rows (the default): `results`, a job object each; columns: `columns`, a list per "
    "field (those of `fields`, else every field each job has), times in epoch seconds "
    "(a fraction of the bytes, and nothing to convert); runs: the same columns, each one "
    'whose values come in long runs of one value sent as `{"runs": [[value, count], '
    "...]}` (what squeue and sacct read)."
)
# The fields of a live queue's columns that name none: those every job object has.
LIVE_FIELDS = tuple(f.name for f in JOB_FIELDS if f.always)


def _shape_field() -> serializers.ChoiceField:
    return serializers.ChoiceField(
        choices=list(SHAPES), required=False, default="rows", help_text=SHAPE_HELP
    )


def _columns(f: Mapping[str, Any]) -> bool:
    """Whether the answer is to be columns (`shape=columns`, or `runs`)."""
    return f["shape"] in COLUMN_SHAPES


def _runs(f: Mapping[str, Any]) -> bool:
    """Whether the columns are to be sent in runs (`shape=runs`: `contract.runs`)."""
    return bool(f["shape"] == "runs")


def _answer_of(name: str, rows: Any, columns: Any) -> PolymorphicProxySerializer:
    """A list's answer: its rows, or its columns (`shape=columns` or `runs`)."""
    return PolymorphicProxySerializer(
        component_name=name, serializers=[rows, columns], resource_type_field_name=None
    )


# POST /api/v1/jobs: one JobSpec, or a list of them; the answer: the job, or the list's.
SUBMISSION_SCHEMA = PolymorphicProxySerializer(
    component_name="JobSubmission",
    serializers=[
        JobSpecSerializer,
        JobSpecSerializer(many=True),  # its bounds: schema.bulk_submission_bounds
    ],
    resource_type_field_name=None,
    many=False,
)
SUBMITTED_SCHEMA = PolymorphicProxySerializer(
    component_name="JobSubmitted",
    serializers=[
        JobSerializer,
        inline_serializer(
            name="JobsSubmitted",
            fields={
                "results": serializers.ListField(
                    child=PolymorphicProxySerializer(
                        component_name="JobOrError",
                        serializers=[JobSerializer, ErrorSerializer],
                        resource_type_field_name=None,
                    )
                )
            },
        ),
    ],
    resource_type_field_name=None,
)


class TenantApi(APIView):
    """An operation of the tenant API: its rate limits, and the scope each method needs
    (`required_scopes`, checked by spurcloud.api.permissions.TokenHasScope).

    The per-address limit is checked before the token is looked up, so a flood of bad
    tokens costs a cache hit each, not a database query; the others (per token, and
    whatever `get_throttles` adds) after."""

    required_scopes: ClassVar[Mapping[str, str]] = {}

    def perform_authentication(self, request: Request) -> None:
        throttling.check_throttles([throttling.IpRateThrottle()], request, self)
        super().perform_authentication(request)

    def check_throttles(self, request: Request) -> None:
        throttling.check_throttles(self.get_throttles(), request, self)


class ClosedQueryApi(TenantApi):
    """A view that refuses query parameters it does not take (a misspelt filter would
    otherwise return everything, unfiltered). Filters read the query as a plain dict, not
    as a form: an empty `?limit=` is an invalid number, not an absent one."""

    query_parameters: frozenset[str] = frozenset()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        unknown = sorted(set(request.query_params) - self.query_parameters)
        if unknown:
            raise serializers.ValidationError(
                {"query": [f"unknown query parameter(s): {', '.join(unknown)}"]}
            )


class JobsApi(ClosedQueryApi):
    class FilterSerializer(serializers.Serializer[Any]):
        id = CommaIntegers(required=False, help_text="Comma-separated job ids.")
        state = CommaStates(required=False, help_text=STATES_HELP)
        name = serializers.CharField(required=False, allow_blank=True, max_length=200)
        user = CommaNames(
            required=False, item_max_length=150, help_text="Comma-separated user names."
        )
        account = CommaNames(
            required=False, item_max_length=64, help_text="Comma-separated accounts."
        )
        partition = CommaNames(
            required=False, item_max_length=64, help_text="Comma-separated partitions."
        )
        since = serializers.DateTimeField(required=False, help_text="Jobs not over before.")
        until = serializers.DateTimeField(required=False, help_text="Jobs submitted by.")
        cursor = serializers.CharField(
            required=False, max_length=1000, help_text="From the previous answer's next."
        )
        limit = serializers.IntegerField(
            required=False,
            min_value=1,
            max_value=JobHistoryPagination.max_page_size,
            help_text=(
                f"Jobs per page: a page of whole jobs holds at most "
                f"{settings.API_MAX_PAGE_SIZE} (`next` gives the rest), one cut to "
                f"`fields` up to {settings.API_MAX_PROJECTED_PAGE_SIZE}."
            ),
        )

        shape = _shape_field()

        def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
            return {**super().get_fields(), "fields": CommaFields(allowed=HISTORY_FIELDS)}

    query_parameters = frozenset(FilterSerializer().fields)
    required_scopes = {"GET": Scope.READ, "POST": Scope.JOBS}

    def get_throttles(self) -> list[BaseThrottle]:
        throttles = super().get_throttles()
        if self.request.method == "POST":
            throttles.append(throttling.OrganizationSubmitThrottle())
        return throttles

    @extend_schema(
        operation_id="jobs_list",
        summary="Job history (what sacct reads)",
        parameters=[FilterSerializer],
        responses={
            200: _answer_of(
                "JobList",
                _results_of(ListedJobSerializer, "JobPage"),
                JobColumnsSerializer,
            ),
            **BAD,
            **AUTH,
        },
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        organization = request_token(request).organization
        # The version first: rows read after it are at least as new (models.HistoryVersion).
        version = selectors.history_version(organization)
        key = (organization.pk, organization.slug, version, request.build_absolute_uri())
        return Response(
            kept.HISTORY.get(
                key, lambda: self._history(request, organization, filters.validated_data)
            )
        )

    def _history(
        self, request: Request, organization: Organization, f: Mapping[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """The history's page that the filters `f` ask for, and how many jobs it holds."""
        jobs = selectors.job_history(
            organization=organization,
            ids=f.get("id"),
            states=f.get("state"),
            name=f.get("name"),
            user=f.get("user"),
            since=f.get("since"),
            until=f.get("until"),
            accounts=f.get("account"),
            partitions=f.get("partition"),
        )
        fields = f.get("fields", HISTORY_FIELDS)
        if _columns(f):
            tuples, names = jobobject.history_tuples(jobs, fields)
            cursor = JobHistoryPagination()
            window = cursor.paginate_queryset(tuples, request, view=self) or []
            columns = jobobject.columns_of_tuples(
                window, names, tenant=organization.slug, fields=fields, runs=_runs(f)
            )
            return len(window), {
                "n": len(window),
                "next": cursor.get_next_link(),
                "columns": columns,
            }
        paginator = JobHistoryPagination()
        rows = jobobject.history_values(jobs, fields)
        page = paginator.paginate_queryset(rows, request, view=self) or []
        results = [jobobject.from_values(r, tenant=organization.slug, fields=fields) for r in page]
        return len(results), paginator.get_paginated_response(results).data

    @extend_schema(
        operation_id="jobs_submit",
        summary="Submit a batch job, or several at once (a list)",
        description=(
            "A JobSpec submits one job and answers it. A list of up to "
            f"{settings.API_MAX_BULK_SUBMIT} submits them together (one round trip to the "
            "scheduler, one log entry): every spec is checked first, and one invalid "
            "refuses the list (400 naming its index, nothing submitted); the answer lists, "
            "in order, each job, or the error that refused that one alone."
        ),
        request=SUBMISSION_SCHEMA,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="Retrying with the same key returns the same job (or jobs).",
            )
        ],
        responses={
            201: OpenApiResponse(response=SUBMITTED_SCHEMA, description="Submitted."),
            **BAD,
            **AUTH,
            **FORBIDDEN,
            **DOWN,
        },
    )
    def post(self, request: Request) -> Response:
        several = isinstance(request.data, list)
        items = request.data if several else [request.data]
        if several and not 1 <= len(items) <= settings.API_MAX_BULK_SUBMIT:
            raise serializers.ValidationError(
                f"a list of 1 to {settings.API_MAX_BULK_SUBMIT} job specs, not {len(items)}"
            )
        specs = []
        for index, item in enumerate(items):
            body = JobSpecSerializer(data=item)
            if not body.is_valid():
                raise serializers.ValidationError(
                    {str(index): body.errors} if several else body.errors
                )
            specs.append(body.validated_data)
        token = request_token(request)
        results = services.submit_jobs(
            organization=token.organization,
            user=request_user(request),
            specs=specs,
            idempotency_key=request.headers.get("Idempotency-Key", "")[:200],
            operator=request_is_operator(request),
            submitter=services.Submitter(
                role=token.member_role, email_confirmed=token.email_confirmed
            ),
        )
        if not several:
            (result,) = results
            if isinstance(result, RpcError):
                raise result
            return Response(result, status=status.HTTP_201_CREATED)
        answers = [r.body() if isinstance(r, RpcError) else r for r in results]
        return Response({"results": answers}, status=status.HTTP_201_CREATED)


class JobDetailApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="jobs_retrieve",
        summary="One job from the history, with its spec",
        responses={200: JobSerializer, **AUTH, **MISSING},
    )
    def get(self, request: Request, job_id: int) -> Response:
        organization = request_token(request).organization
        record = selectors.access_job(organization=organization, job_id=job_id)
        return Response(jobobject.from_record(record, tenant=organization.slug, with_spec=True))


class JobActionSchema(AutoSchema):
    """Each job action has its own path (`/v1/jobs/{id}/<action>`, from the contract) and
    its own operation: its id, help and body come from the action named by the path."""

    def action(self) -> JobAction:
        return JobAction(self.path.rstrip("/").rsplit("/", 1)[-1])

    def get_operation_id(self) -> str:
        return f"jobs_{self.action().value}"

    def get_summary(self) -> str:
        return self.action().help

    def get_request_serializer(self) -> Any:
        return JobCancelSerializer if self.action().takes_signal else None


class JobActionApi(ClosedQueryApi):
    schema = JobActionSchema()
    required_scopes = {"POST": Scope.JOBS}

    @extend_schema(
        responses={
            200: LiveJobSerializer,
            **BAD,
            **AUTH,
            **FORBIDDEN,
            **MISSING,
            **CONFLICT,
            **DOWN,
        },
    )
    def post(self, request: Request, job_id: int, action: JobAction) -> Response:
        signal = None
        if action.takes_signal:
            body = JobCancelSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            signal = body.validated_data.get("signal")
        elif request.data not in ({}, None):
            raise serializers.ValidationError(f"{action} takes no body")
        job = services.act_on_job(
            organization=request_token(request).organization,
            user=request_user(request),
            job_id=job_id,
            action=action,
            signal=signal,
            operator=request_is_operator(request),
        )
        return Response(job)


class QueueApi(ClosedQueryApi):
    class FilterSerializer(serializers.Serializer[Any]):
        id = CommaIntegers(
            required=False,
            help_text="Comma-separated job ids; an array job's id names its tasks too.",
        )
        state = CommaStates(required=False, help_text=STATES_HELP)
        user = CommaNames(
            required=False, item_max_length=150, help_text="Comma-separated user names."
        )
        name = CommaNames(
            required=False, item_max_length=200, help_text="Comma-separated job names."
        )
        account = CommaNames(
            required=False, item_max_length=64, help_text="Comma-separated accounts."
        )
        partition = CommaNames(
            required=False, item_max_length=64, help_text="Comma-separated partitions."
        )

        shape = _shape_field()

        def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
            return {**super().get_fields(), "fields": CommaFields(allowed=FIELD_NAMES)}

    query_parameters = frozenset(FilterSerializer().fields)
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="queue_list",
        summary="Live queue (what squeue reads)",
        parameters=[FilterSerializer],
        responses={
            200: _answer_of(
                "QueueList",
                _results_of(ListedLiveJobSerializer, "QueuePage"),
                LiveJobColumnsSerializer,
            ),
            **BAD,
            **AUTH,
            **DOWN,
        },
    )
    def get(self, request: Request) -> Response | HttpResponse:
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        f = filters.validated_data
        if _columns(f):
            raw = selectors.live_queue_columns(
                organization=request_token(request).organization,
                ids=f.get("id"),
                states=f.get("state"),
                user=f.get("user"),
                names=f.get("name"),
                accounts=f.get("account"),
                partitions=f.get("partition"),
                fields=f.get("fields", LIVE_FIELDS),
                runs=_runs(f),
            )
            if raw[:1] != b"{":
                raise Unavailable("the scheduler's answer is not a JSON object")
            # The controller's answer as it came (`{"n", "columns"}`, the organisation's
            # jobs only, cut to the fields checked above), with the page link the list
            # answers carry: no decoding, converting or encoding 10,000 jobs here.
            return HttpResponse(b'{"next":null,' + raw[1:], content_type="application/json")
        jobs = selectors.live_queue(
            organization=request_token(request).organization,
            ids=f.get("id"),
            states=f.get("state"),
            user=f.get("user"),
            names=f.get("name"),
            accounts=f.get("account"),
            partitions=f.get("partition"),
            fields=f.get("fields"),
        )
        return Response(unpaginated(jobs))


class NodesApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="nodes_list",
        summary="Nodes (what sinfo reads)",
        description=(
            "What a tenant sees of each node: its size, GPU models, partitions, state and "
            "how much of it is allocated, not which devices other jobs hold nor how to "
            "reach it. An operator (a staff user's token with the admin scope) gets the "
            "controller's whole node dict (agent URL, PCIe addresses, GPUs in use, ...)."
        ),
        responses={200: _results_of(NodeSerializer, "NodePage"), **AUTH, **DOWN},
    )
    def get(self, request: Request) -> Response:
        return Response(unpaginated(selectors.cluster_nodes(operator=request_is_operator(request))))


class PartitionsApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="partitions_list",
        summary="Partitions",
        responses={200: _results_of(PartitionSerializer, "PartitionPage"), **AUTH, **DOWN},
    )
    def get(self, request: Request) -> Response:
        return Response(unpaginated(selectors.cluster_partitions()))


class JobOutputApi(ClosedQueryApi):
    """A job's stdout or stderr, read from the agent of the job's first node (where the
    batch script runs), a chunk at a time: follow `next_offset` while `running`."""

    class FilterSerializer(serializers.Serializer[Any]):
        stream = serializers.ChoiceField(
            choices=["stdout", "stderr"], required=False, default="stdout"
        )
        offset = serializers.IntegerField(
            required=False, default=0, min_value=0, max_value=MAX_ID, help_text="Bytes to skip."
        )
        limit = serializers.IntegerField(
            required=False,
            default=min(65536, settings.API_OUTPUT_MAX_BYTES),
            min_value=1,
            max_value=settings.API_OUTPUT_MAX_BYTES,
            help_text="The most bytes to read.",
        )

    query_parameters = frozenset(FilterSerializer().fields)
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="jobs_output",
        summary="A job's output (stdout or stderr), a chunk at a time",
        parameters=[FilterSerializer],
        responses={
            200: JobOutputSerializer,
            **BAD,
            **AUTH,
            404: _error(
                "No such job here (or another organisation's), or it has not started, or "
                "its node has no output of it."
            ),
            503: _error("The scheduler or the job's node is unreachable."),
        },
    )
    def get(self, request: Request, job_id: int) -> Response:
        query = self.FilterSerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        q = query.validated_data
        output = selectors.job_output(
            organization=request_token(request).organization,
            job_id=job_id,
            stream=q["stream"],
            offset=q["offset"],
            limit=q["limit"],
        )
        return Response(output)
