"""The tenant API v1 (docs/architecture.md, "Web API"). One view per operation; each reads
the organisation from the token (`request.auth.organization`) and calls one service or
selector."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from spurcloud.api.pagination import JobHistoryPagination, unpaginated
from spurcloud.api.serializers import (
    ErrorSerializer,
    JobSerializer,
    JobSpecSerializer,
    JobWithSpecSerializer,
    NodeSerializer,
    PartitionSerializer,
)
from spurcloud.jobs import jobobject, selectors, services
from spurcloud.jobs.models import JobState

ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="Refused, with the reason."),
    401: OpenApiResponse(ErrorSerializer, description="Bad, missing or revoked token."),
    503: OpenApiResponse(ErrorSerializer, description="The scheduler is unreachable."),
}
NOT_FOUND = {404: OpenApiResponse(ErrorSerializer, description="No such job here.")}


def _results_of(serializer: type[serializers.Serializer], name: str) -> Any:
    return inline_serializer(
        name=name,
        fields={
            "results": serializer(many=True),
            "next": serializers.URLField(allow_null=True),
        },
    )


class CommaIntegers(serializers.CharField):
    def to_internal_value(self, data: Any) -> list[int]:
        text = super().to_internal_value(data)
        try:
            return [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise serializers.ValidationError("must be a comma-separated list of job ids") from None


class CommaStates(serializers.CharField):
    def to_internal_value(self, data: Any) -> list[str]:
        states = [s.strip().upper() for s in super().to_internal_value(data).split(",")]
        states = [s for s in states if s]
        unknown = sorted(set(states) - set(JobState.values))
        if unknown:
            raise serializers.ValidationError(f"unknown state(s): {', '.join(unknown)}")
        return states


class JobsApi(APIView):
    class FilterSerializer(serializers.Serializer):
        id = CommaIntegers(required=False, help_text="Comma-separated job ids.")
        state = CommaStates(required=False, help_text="Comma-separated states.")
        name = serializers.CharField(required=False)
        user = serializers.CharField(required=False)
        since = serializers.DateTimeField(required=False, help_text="Jobs not over before.")
        until = serializers.DateTimeField(required=False, help_text="Jobs submitted by.")

    @extend_schema(
        operation_id="jobs_list",
        summary="Job history (what sacct reads)",
        parameters=[
            FilterSerializer,
            OpenApiParameter("cursor", str, description="From the previous answer's next."),
            OpenApiParameter("limit", int, description="Jobs per page."),
        ],
        responses={200: _results_of(JobSerializer, "JobPage"), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        f = filters.validated_data
        organization = request.auth.organization
        jobs = selectors.job_history(
            organization=organization,
            ids=f.get("id"),
            states=f.get("state"),
            name=f.get("name"),
            user=f.get("user"),
            since=f.get("since"),
            until=f.get("until"),
        )
        paginator = JobHistoryPagination()
        page = paginator.paginate_queryset(jobs, request, view=self) or []
        results = [jobobject.from_record(r, tenant=organization.slug) for r in page]
        return paginator.get_paginated_response(results)

    @extend_schema(
        operation_id="jobs_submit",
        summary="Submit a batch job",
        request=JobSpecSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="Retrying with the same key returns the same job.",
            )
        ],
        responses={201: JobWithSpecSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        job = services.submit_job(
            organization=request.auth.organization,
            user=request.user,
            spec=request.data,
            idempotency_key=request.headers.get("Idempotency-Key", "")[:200],
        )
        return Response(job, status=status.HTTP_201_CREATED)


class JobDetailApi(APIView):
    @extend_schema(
        operation_id="jobs_retrieve",
        summary="One job, with its spec",
        responses={200: JobWithSpecSerializer, **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, job_id: int) -> Response:
        organization = request.auth.organization
        record = selectors.access_job(organization=organization, job_id=job_id)
        return Response(jobobject.from_record(record, tenant=organization.slug, with_spec=True))


class JobCancelApi(APIView):
    class InputSerializer(serializers.Serializer):
        signal = serializers.IntegerField(
            required=False,
            allow_null=True,
            min_value=1,
            max_value=64,
            help_text="Send this signal instead of cancelling (scancel --signal).",
        )

    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job (or signal it)",
        request=InputSerializer,
        responses={200: JobSerializer, **ERRORS, **NOT_FOUND},
    )
    def post(self, request: Request, job_id: int) -> Response:
        body = self.InputSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        job = services.cancel_job(
            organization=request.auth.organization,
            user=request.user,
            job_id=job_id,
            signal=body.validated_data.get("signal"),
        )
        return Response(job)


class JobControlApi(APIView):
    @extend_schema(
        operation_id="jobs_control",
        summary="Hold, release or requeue a job (scontrol hold|release|requeue|requeuehold)",
        parameters=[
            OpenApiParameter("job_id", int, OpenApiParameter.PATH),
            OpenApiParameter("action", str, OpenApiParameter.PATH, enum=list(services.JOB_ACTIONS)),
        ],
        request=None,
        responses={200: JobSerializer, **ERRORS, **NOT_FOUND},
    )
    def post(self, request: Request, job_id: str, action: str) -> Response:
        job = services.control_job(
            organization=request.auth.organization,
            user=request.user,
            job_id=int(job_id),
            action=action,
        )
        return Response(job)


class QueueApi(APIView):
    class FilterSerializer(serializers.Serializer):
        id = CommaIntegers(required=False, help_text="Comma-separated job ids.")
        state = CommaStates(required=False, help_text="Comma-separated states.")
        user = serializers.CharField(required=False)

    @extend_schema(
        operation_id="queue_list",
        summary="Live queue (what squeue reads)",
        parameters=[FilterSerializer],
        responses={200: _results_of(JobSerializer, "QueuePage"), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        f = filters.validated_data
        jobs = selectors.live_queue(
            organization=request.auth.organization,
            ids=f.get("id"),
            states=f.get("state"),
            user=f.get("user"),
        )
        return Response(unpaginated(jobs))


class NodesApi(APIView):
    @extend_schema(
        operation_id="nodes_list",
        summary="Nodes (what sinfo reads)",
        responses={200: _results_of(NodeSerializer, "NodePage"), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(unpaginated(selectors.cluster_nodes()))


class PartitionsApi(APIView):
    @extend_schema(
        operation_id="partitions_list",
        summary="Partitions",
        responses={200: _results_of(PartitionSerializer, "PartitionPage"), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(unpaginated(selectors.cluster_partitions()))
