"""drf-spectacular extensions: how the API token appears in the OpenAPI document,
request bodies described as closed objects (the API refuses unknown fields), and the
Retry-After header of a 429."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)

from scheduler.core.contract.runs import RUNS

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema


# The base class registers each subclass in its __init_subclass__, which has no annotations.
class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "spurcloud.api.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An organisation API token: `Authorization: Bearer spur_...`.",
        }


class ColumnRuns(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    """A column of a columns answer: the typed list `shape=columns` sends, or, with
    `shape=runs`, that list's runs (`contract.runs`)."""

    target_class = "spurcloud.api.serializers.ColumnField"

    def map_serializer_field(self, auto_schema: AutoSchema, direction: Any) -> dict[str, Any]:
        plain: dict[str, Any] = auto_schema._map_serializer_field(  # type: ignore[no-untyped-call]
            self.target, direction, bypass_extensions=True
        )
        runs = {
            "type": "object",
            "description": "With shape=runs, a column of long runs of one value: "
            "[value, how many (1 or more)] each, in the list's order.",
            "properties": {
                RUNS: {
                    "type": "array",
                    "items": {"type": "array", "minItems": 2, "maxItems": 2},
                }
            },
            "required": [RUNS],
            "additionalProperties": False,
        }
        return {"oneOf": [plain, runs], "description": plain.get("description", "")}


NO_NUL = "^[^\\u0000]*$"  # DRF and the core refuse text with NUL in it


def closed_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Say what the API refuses of what a client sends: every request body is an object
    of exactly its fields (the core's `JobSpec.from_dict` and `ClosedSerializer` refuse
    any other), and no text it takes, in a body or a query, may hold NUL."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
            for prop in component.get("properties", {}).values():
                _no_nul(prop)
                _no_nul(prop.get("items", {}))
                _no_nul(prop.get("additionalProperties", {}))
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                _no_nul(parameter.get("schema", {}))
    return result


def _no_nul(schema: Any) -> None:
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not ({"pattern", "format", "enum"} & set(schema)):
        schema["pattern"] = NO_NUL
    for alternative in schema.get("oneOf", []):
        _no_nul(alternative)


def retry_after_headers(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A 429 comes with `Retry-After`, in whole seconds (spurcloud/api/throttling.py):
    drf-spectacular has no way to declare an answer's headers on the view."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            throttled = operation.get("responses", {}).get("429")
            if throttled is not None:
                throttled.setdefault("headers", {})["Retry-After"] = {
                    "description": "Seconds to wait before trying again.",
                    "schema": {"type": "integer", "minimum": 0},
                    "required": True,
                }
    return result


def bulk_submission_bounds(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A bulk submission (POST /api/v1/jobs with a list) holds 1 to API_MAX_BULK_SUBMIT
    specs: drf-spectacular does not state a list serializer's bounds."""
    submission = result.get("components", {}).get("schemas", {}).get("JobSubmissionRequest", {})
    for alternative in submission.get("oneOf", []):
        if alternative.get("type") == "array":
            alternative.update(minItems=1, maxItems=settings.API_MAX_BULK_SUBMIT)
    return result
