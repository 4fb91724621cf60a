"""`scontrol update NodeName=x State=DRAIN Reason=... | State=RESUME`: an operator (a
staff user's token with the admin scope) drains or resumes a node. Everyone else is
refused: a token without the admin scope by its scope (403), a tenant's admin-scoped
token by `jobs.nodes` (403)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from scheduler.core.commands import MAX_NODE_REASON
from spurcloud.api.authentication import request_user
from spurcloud.api.serializers import NodeSerializer
from spurcloud.api.views import AUTH, BAD, DOWN, ClosedQueryApi, _error
from spurcloud.jobs.nodes import drain_node, resume_node
from spurcloud.tenants.models import Scope

# What NodeSpec accepts as a name (scheduler/core/resources.py), for the URL.
NODE_NAME_PATTERN = r"[A-Za-z0-9_-]{1,63}"


class NodeUpdateSerializer(serializers.Serializer[Any]):
    state = serializers.ChoiceField(
        choices=["drain", "resume"],
        help_text="drain: no new job goes there (those running run on); resume: it takes jobs.",
    )
    reason = serializers.CharField(
        required=False,
        default="",
        allow_blank=True,
        max_length=MAX_NODE_REASON,
        help_text="Why (needed to drain): what sinfo -R and the nodes pages show.",
    )


class NodeUpdateApi(ClosedQueryApi):
    required_scopes = {"PATCH": Scope.ADMIN}

    @extend_schema(
        operation_id="nodes_update",
        summary="Drain or resume a node (scontrol update NodeName=... State=DRAIN|RESUME)",
        request=NodeUpdateSerializer,
        responses={
            200: NodeSerializer,
            **BAD,
            **AUTH,
            403: _error("Not an operator: only a staff user's admin-scoped token."),
            404: _error("No such node."),
            **DOWN,
        },
    )
    def patch(self, request: Request, name: str) -> Response:
        body = NodeUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = request_user(request)
        if body.validated_data["state"] == "resume":
            return Response(resume_node(user=user, node=name))
        return Response(drain_node(user=user, node=name, reason=body.validated_data["reason"]))
