"""The API's reads of the cluster for the admin commands: a live job with its spec
(scontrol show job), the controllers' state (scontrol ping), the configuration (scontrol
show config), pending jobs' priority factors (sprio), fair share (sshare), and the
accounts, users and QoS (sacctmgr show).

Tenant-scoped: a tenant sees its own jobs' priorities and its own account's shares and
members; an operator (a staff user's admin-scoped token) sees every tenant's. Nothing
here reveals another tenant's name, jobs or usage to a tenant, nor the controllers'
addresses.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from scheduler.client import ControllerClient
from scheduler.core.arrays import MAX_ARRAY_SIZE
from scheduler.core.contract import JobState
from scheduler.core.contract.update import UPDATE_FIELDS, parse_update
from scheduler.core.errors import InvalidSpec
from scheduler.rpc.errors import NotFound, RpcError
from spurcloud.api.authentication import request_is_operator, request_token, request_user
from spurcloud.api.pagination import unpaginated
from spurcloud.api.serializers import ClosedSerializer, LiveJobSerializer, _spec_field
from spurcloud.api.views import (
    AUTH,
    BAD,
    CONFLICT,
    DOWN,
    FORBIDDEN,
    MISSING,
    ClosedQueryApi,
    _results_of,
)
from spurcloud.jobs import jobobject, services
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.errors import job_not_found_message
from spurcloud.tenants.models import Membership, Organization, Scope


class JobUpdateSerializer(ClosedSerializer):
    """The body of PATCH /api/v1/queue/{id}: the contract's UPDATE_FIELDS, with the spec's
    own bounds."""

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {f.name: _spec_field(f) for f in UPDATE_FIELDS}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            return {}  # an empty PATCH changes nothing (and reaches no log)
        try:
            return dict(parse_update(attrs))
        except InvalidSpec as exc:
            raise serializers.ValidationError(
                {exc.field or "non_field_errors": [exc.message]}
            ) from exc


class LiveJobDetailApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ, "PATCH": Scope.JOBS}

    @extend_schema(
        operation_id="queue_update",
        summary="Change a pending job's name, time limit, nice, partition or comment "
        "(scontrol update)",
        request=JobUpdateSerializer,
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
    def patch(self, request: Request, job_id: int) -> Response:
        body = JobUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = services.update_job(
            organization=request_token(request).organization,
            user=request_user(request),
            job_id=job_id,
            changes=body.validated_data,
            operator=request_is_operator(request),
        )
        return Response(job)

    @extend_schema(
        operation_id="queue_retrieve",
        summary="One live job with its spec (what scontrol show job reads)",
        responses={200: LiveJobSerializer, **AUTH, **MISSING, **DOWN},
    )
    def get(self, request: Request, job_id: int) -> Response:
        organization = request_token(request).organization
        try:
            job = controller_client().job(job_id, tenant=organization.slug)
        except NotFound as exc:
            raise Http404(job_not_found_message(job_id)) from exc
        if job.get("tenant") != organization.slug:
            raise Http404(job_not_found_message(job_id))
        return Response(jobobject.from_controller(job))


class ControllerStateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(help_text="The replica (its host, to operators).")
    up = serializers.BooleanField(help_text="Whether it answered.")
    role = serializers.CharField(help_text="leader, follower, candidate or unreachable.")


class PingApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="ping",
        summary="The controller replicas' state (what scontrol ping reads)",
        responses={
            200: inline_serializer(
                name="Ping",
                fields={"controllers": ControllerStateSerializer(many=True)},
            ),
            **AUTH,
        },
    )
    def get(self, request: Request) -> Response:
        operator = request_is_operator(request)
        rows = []
        for index, url in enumerate(settings.SPUR_CONTROLLER_URLS):
            name = url.split("//", 1)[-1].split(":", 1)[0] if operator else f"spurctld{index}"
            role = "unreachable"
            client = ControllerClient(
                [url], settings.SPUR_CLUSTER_TOKEN, timeout=2.0, retry_for_s=0.0
            )
            try:
                role = str(client.raft().get("role") or "unknown")
            except RpcError:
                role = "unreachable"
            finally:
                client.close()
            rows.append({"name": name, "up": role != "unreachable", "role": role})
        return Response({"controllers": rows})


def config_pairs(policy: dict[str, Any]) -> dict[str, str]:
    """scontrol show config's pairs, each from where the fact is kept."""
    weights = policy.get("weights") or {}
    max_age_days = int(float(weights.get("max_age_s") or 0) // 86400)
    return {
        "ClusterName": str(policy.get("cluster_name") or settings.SPUR_CLUSTER_NAME),
        # The controller's: how long it keeps an ended job before purging it.
        "MinJobAge": f"{int(policy.get('min_job_age_s') or 0)} sec",
        "MaxArraySize": str(MAX_ARRAY_SIZE),
        "SchedulerType": "sched/backfill",
        "SelectType": "select/cons_tres",
        "PriorityType": "priority/multifactor",
        "PriorityMaxAge": f"{max_age_days}-00:00:00",
        "PriorityWeightAge": str(weights.get("age", 0)),
        "PriorityWeightFairShare": str(weights.get("fairshare", 0)),
        "PriorityWeightJobSize": str(weights.get("size", 0)),
        "PriorityWeightPartition": str(weights.get("partition", 0)),
        "PriorityWeightQOS": str(weights.get("qos", 0)),
        "GresTypes": "gpu",
        "AccountingStorageType": "accounting_storage/spurcloud",
        "SLURM_VERSION": "22.05.8",
    }


class ConfigApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="config_retrieve",
        summary="The cluster's configuration (what scontrol show config reads)",
        responses={
            200: inline_serializer(
                name="ClusterConfig",
                fields={"config": serializers.DictField(child=serializers.CharField())},
            ),
            **AUTH,
            **DOWN,
        },
    )
    def get(self, request: Request) -> Response:
        return Response({"config": config_pairs(controller_client().policy())})


class PrioritySerializer(serializers.Serializer[Any]):
    job_id = serializers.IntegerField()
    user = serializers.CharField()
    account = serializers.CharField()
    partition = serializers.CharField()
    qos = serializers.CharField()
    priority = serializers.IntegerField()
    age = serializers.FloatField(help_text="Each factor is in [0, 1].")
    fairshare = serializers.FloatField()
    qos_factor = serializers.FloatField()
    partition_factor = serializers.FloatField()
    size = serializers.FloatField()
    nice = serializers.IntegerField()


class PrioritiesApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="priorities_list",
        summary="Pending jobs' priority factors (what sprio reads)",
        description=(
            "As the controller's last pass ranked them. A tenant sees its own jobs; an "
            "operator every tenant's."
        ),
        responses={200: _results_of(PrioritySerializer, "PriorityPage"), **AUTH, **DOWN},
    )
    def get(self, request: Request) -> Response:
        tenant = None if request_is_operator(request) else request_token(request).organization.slug
        jobs = controller_client().jobs(tenant=tenant, states=[JobState.PENDING.value])
        rows = []
        for job in sorted(jobs, key=lambda j: int(j["job_id"])):
            if tenant is not None and job.get("tenant") != tenant:
                continue
            f = job.get("priority_factors") or {}
            rows.append(
                {
                    "job_id": int(job["job_id"]),
                    "user": str(job.get("user", "")),
                    "account": str(job.get("account", "")),
                    "partition": str(job.get("partition", "")),
                    "qos": str(job.get("qos", "")),
                    "priority": int(f.get("priority", job.get("priority") or 0)),
                    "age": float(f.get("age", 0.0)),
                    "fairshare": float(f.get("fairshare", 0.0)),
                    "qos_factor": float(f.get("qos", 0.0)),
                    "partition_factor": float(f.get("partition", 0.0)),
                    "size": float(f.get("size", 0.0)),
                    "nice": int(f.get("nice", 0)),
                }
            )
        return Response(unpaginated(rows))


class ShareSerializer(serializers.Serializer[Any]):
    account = serializers.CharField()
    user = serializers.CharField(allow_blank=True, help_text='"" on the account\'s row.')
    raw_shares = serializers.IntegerField()
    norm_shares = serializers.FloatField()
    raw_usage = serializers.IntegerField(help_text="Decayed GPU-seconds.")
    norm_usage = serializers.FloatField()
    fairshare = serializers.FloatField()


def _members(organizations: list[Organization]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {o.slug: [] for o in organizations}
    memberships = Membership.objects.filter(organization__in=organizations).select_related(
        "organization", "user"
    )
    for m in memberships.order_by("organization__slug", "user__username"):
        out[m.organization.slug].append(m.user.get_username())
    return out


def _organizations(request: Request) -> list[Organization]:
    if request_is_operator(request):
        return list(Organization.objects.order_by("slug"))
    return [request_token(request).organization]


class SharesApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="shares_list",
        summary="Fair share per account and its users (what sshare reads)",
        description=(
            "The organisation is the account; its members are its users, who share the "
            "account's usage. A tenant sees its own account; an operator every account."
        ),
        responses={200: _results_of(ShareSerializer, "SharePage"), **AUTH, **DOWN},
    )
    def get(self, request: Request) -> Response:
        organizations = _organizations(request)
        members = _members(organizations)
        policy = controller_client().policy()
        known = {str(a["account"]): a for a in policy.get("accounts") or []}
        rows = []
        for slug, users in members.items():
            a = known.get(slug, {})
            share = {
                "account": slug,
                "raw_shares": int(a.get("shares", 1)),
                "norm_shares": float(a.get("norm_shares", 0.0)),
                "raw_usage": int(float(a.get("usage_gpu_s", 0.0))),
                "norm_usage": float(a.get("norm_usage", 0.0)),
                "fairshare": float(a.get("fairshare", 1.0)),
            }
            rows.append({**share, "user": ""})
            rows += [{**share, "user": user} for user in users]
        return Response(unpaginated(rows))


class AssociationSerializer(serializers.Serializer[Any]):
    cluster = serializers.CharField()
    account = serializers.CharField()
    user = serializers.CharField(allow_blank=True, help_text='"" on the account\'s row.')
    role = serializers.CharField(allow_blank=True)
    shares = serializers.IntegerField()
    qos = serializers.ListField(child=serializers.CharField())
    default_qos = serializers.CharField(allow_blank=True)


class AssociationsApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="associations_list",
        summary="Accounts and their users (what sacctmgr show user|account|assoc reads)",
        responses={200: _results_of(AssociationSerializer, "AssociationPage"), **AUTH, **DOWN},
    )
    def get(self, request: Request) -> Response:
        organizations = _organizations(request)
        policy = controller_client().policy()
        qos = [str(q["name"]) for q in policy.get("qos") or []]
        default_qos = str(policy.get("default_qos") or "")
        shares = {str(a["account"]): int(a.get("shares", 1)) for a in policy.get("accounts") or []}
        roles = {
            (m.organization.slug, m.user.get_username()): str(m.role)
            for m in Membership.objects.filter(organization__in=organizations).select_related(
                "organization", "user"
            )
        }
        rows = []
        for org in organizations:
            common = {
                "cluster": settings.SPUR_CLUSTER_NAME,
                "account": org.slug,
                "shares": shares.get(org.slug, 1),
                "qos": qos,
                "default_qos": default_qos,
            }
            rows.append({**common, "user": "", "role": ""})
            for (slug, user), role in sorted(roles.items()):
                if slug == org.slug:
                    rows.append({**common, "user": user, "role": role})
        return Response(unpaginated(rows))


class QosSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    priority = serializers.IntegerField()
    preempt = serializers.ListField(child=serializers.CharField())
    preempt_mode = serializers.CharField()
    grace_s = serializers.FloatField()
    max_gpus_per_user = serializers.IntegerField(allow_null=True)
    max_gpus_per_account = serializers.IntegerField(allow_null=True)
    max_jobs_per_user = serializers.IntegerField(allow_null=True)


class QosApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="qos_list",
        summary="The QoS table (what sacctmgr show qos reads)",
        responses={200: _results_of(QosSerializer, "QosPage"), **AUTH, **DOWN},
    )
    def get(self, request: Request) -> Response:
        return Response(unpaginated(list(controller_client().policy().get("qos") or [])))


class SwitchSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    level = serializers.IntegerField(help_text="0 for a leaf; one above its highest child.")
    nodes = serializers.ListField(child=serializers.CharField(), help_text="Every node under it.")
    switches = serializers.ListField(child=serializers.CharField(), help_text="Its children.")


class TopologyApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="topology_list",
        summary="The switch tree (what scontrol show topology reads)",
        responses={200: _results_of(SwitchSerializer, "SwitchPage"), **AUTH, **DOWN},
    )
    def get(self, request: Request) -> Response:
        return Response(unpaginated(list(controller_client().policy().get("switches") or [])))
