"""What an API token may do: its scopes (`tenants.models.Scope`).

Each API view names the scope each of its methods needs (`required_scopes`, e.g.
`{"GET": "read", "POST": "jobs"}`); a token without it is refused with a 403 that names
the scope. A method a view names no scope for is refused (fail closed): a new view that
forgets to say cannot be reached with any token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from spurcloud.tenants.models import ApiToken, Scope

# HEAD reads what GET reads; OPTIONS describes the operation.
_SAME_AS = {"HEAD": "GET", "OPTIONS": "GET"}


def required_scope(view: Any, method: str) -> str | None:
    scopes: Mapping[str, str] = getattr(view, "required_scopes", {})
    return scopes.get(method) or scopes.get(_SAME_AS.get(method, ""))


class TokenHasScope(BasePermission):
    message = "This API token may not do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return False  # IsAuthenticated, before this, answers 401 for a missing token
        scope = required_scope(view, request.method or "")
        if scope is None:
            self.message = f"{request.method} is not allowed with an API token here."
            return False
        if token.has_scope(scope):
            return True
        self.message = (
            f"This API token lacks the {Scope(scope).value!r} scope that this needs "
            f"(it has: {', '.join(token.scopes.split())}); create a token with it in the portal."
        )
        return False
