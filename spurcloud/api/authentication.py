"""`Authorization: Bearer spur_...`: the tenant API token.

The secret is looked up by its SHA-256, so the comparison happens on a hash in an index,
never character by character on the secret; a final `compare_digest` keeps it that way
whatever the database does. A revoked or expired token, one whose user left the
organisation, and one whose user has not confirmed their email where that is required,
are refused with a 401 that says which. On success, `request.user` is the token's user
and `request.auth` the token (with its `organization`). What the token may do (its
scopes) is spurcloud/api/permissions.py's to check."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, cast

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from spurcloud.tenants import tokens
from spurcloud.tenants.models import ApiToken, Scope
from spurcloud.tenants.selectors import UNCONFIRMED_EMAIL_MESSAGE, email_confirmation_required
from spurcloud.tenants.services import touch_api_token
from spurcloud.tenants.token_cache import api_token_for_secret_kept

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from spurcloud.tenants.selectors import AnnotatedApiToken

KEYWORD = "Bearer"


class ApiTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None  # IsAuthenticated answers 401 "credentials were not provided"
        keyword, _, secret = header.strip().partition(" ")
        secret = secret.strip()
        if keyword.lower() != KEYWORD.lower() or not secret or " " in secret:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer spur_...'."
            )
        return self.authenticate_secret(secret)

    def authenticate_secret(self, secret: str) -> tuple[User, ApiToken]:
        """The token's user and the token, for a secret however it arrived (the
        slurmrestd routes also take it as `X-SLURM-USER-TOKEN`); AuthenticationFailed
        says why not."""
        # Read at most every API_TOKEN_CACHE_S seconds (spurcloud/tenants/token_cache.py);
        # every check below runs at each request.
        token = api_token_for_secret_kept(secret)
        if token is None or not hmac.compare_digest(token.token_hash, tokens.hash_secret(secret)):
            raise exceptions.AuthenticationFailed("Invalid API token.")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API token has been revoked.")
        if token.is_expired(timezone.now()):
            assert token.expires_at is not None
            raise exceptions.AuthenticationFailed(
                f"This API token expired at {token.expires_at:%Y-%m-%d %H:%M} UTC; "
                "create a new one in the portal."
            )
        if not token.user.is_active or token.member_role is None:
            raise exceptions.AuthenticationFailed(
                "This API token's user is no longer active in its organisation."
            )
        if email_confirmation_required() and not token.email_confirmed:
            raise exceptions.AuthenticationFailed(UNCONFIRMED_EMAIL_MESSAGE)
        touch_api_token(token=token)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        # Present, so that DRF answers 401 (with WWW-Authenticate) rather than 403.
        return f'{KEYWORD} realm="api"'


# DRF types `request.user` and `request.auth` for any authentication. Behind this one and
# IsAuthenticated (the API's defaults) they are the token's user and the token: these say so.


def request_token(request: Request) -> AnnotatedApiToken:
    """The API token that authenticated the request (`request.auth`), as authentication
    read it: with its user's role and confirmed address (`api_token_for_secret`)."""
    return cast("AnnotatedApiToken", request.auth)


def request_user(request: Request) -> User:
    """The user of the API token that authenticated the request (`request.user`)."""
    return cast("User", request.user)


def request_is_operator(request: Request) -> bool:
    """A cluster operator's request: a staff user's token with the admin scope. Staff
    powers at the API (every node detail, a negative nice) need both: a staff member's
    everyday token (read, jobs) carries none of them."""
    return request_user(request).is_staff and request_token(request).has_scope(Scope.ADMIN)
