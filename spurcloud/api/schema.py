"""drf-spectacular extensions: how the API token appears in the OpenAPI document, and
request bodies described as closed objects (the API refuses unknown fields)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

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


def closed_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Every request body the API takes is an object of exactly its fields (the core's
    `JobSpec.from_dict` and `ClosedSerializer` refuse any other): say so."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    return result
