"""`Authorization: Bearer spur_...`: the tenant API token.

The secret is looked up by its SHA-256, so the comparison happens on a hash in an index,
never character by character on the secret; a final `compare_digest` keeps it that way
whatever the database does. On success, `request.user` is the token's user and
`request.auth` the token (with its `organization`)."""

from __future__ import annotations

import hmac

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from spurcloud.tenants import tokens
from spurcloud.tenants.models import ApiToken
from spurcloud.tenants.selectors import api_token_for_secret
from spurcloud.tenants.services import touch_api_token

KEYWORD = "Bearer"


class ApiTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[object, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None  # IsAuthenticated answers 401 "credentials were not provided"
        keyword, _, secret = header.strip().partition(" ")
        secret = secret.strip()
        if keyword.lower() != KEYWORD.lower() or not secret or " " in secret:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer spur_...'."
            )
        token = api_token_for_secret(secret)
        if token is None or not hmac.compare_digest(token.token_hash, tokens.hash_secret(secret)):
            raise exceptions.AuthenticationFailed("Invalid API token.")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API token has been revoked.")
        if not token.user.is_active or not token.is_member:  # type: ignore[attr-defined]
            raise exceptions.AuthenticationFailed(
                "This API token's user is no longer active in its organisation."
            )
        touch_api_token(token=token)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        # Present, so that DRF answers 401 (with WWW-Authenticate) rather than 403.
        return f'{KEYWORD} realm="api"'
