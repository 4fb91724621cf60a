"""The API token as slurmrestd clients send a JWT: `X-SLURM-USER-TOKEN: spur_...` (with
`X-SLURM-USER-NAME`, optional, which must then name the token's user), or
`Authorization: Bearer spur_...`. The token itself is checked as the web API checks it
(spurcloud/api/authentication.py: revoked, expired, left the organisation, unconfirmed
email); its scopes and the rate limits apply as they do there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import exceptions
from rest_framework.request import Request

from spurcloud.api.authentication import ApiTokenAuthentication
from spurcloud.tenants.models import ApiToken

if TYPE_CHECKING:
    from django.contrib.auth.models import User

TOKEN_HEADER = "X-SLURM-USER-TOKEN"
USER_HEADER = "X-SLURM-USER-NAME"
MAX_HEADER = 512  # a token is far shorter; a longer header is not one


class SlurmTokenAuthentication(ApiTokenAuthentication):
    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        token = request.headers.get(TOKEN_HEADER)
        name = request.headers.get(USER_HEADER)
        header = request.headers.get("Authorization", "").strip()
        if token is not None and header:
            raise exceptions.AuthenticationFailed(
                f"Give the API token once: in {TOKEN_HEADER} or in Authorization, not both."
            )
        if token is None:
            if header and not header.lower().startswith("bearer "):
                raise exceptions.AuthenticationFailed(
                    "Malformed Authorization header: expected 'Bearer spur_...', or the API "
                    f"token alone in {TOKEN_HEADER}."
                )
            if not header and name is not None:
                raise exceptions.AuthenticationFailed(
                    f"{USER_HEADER} was given without {TOKEN_HEADER}: send the API token in "
                    f"{TOKEN_HEADER} or as 'Authorization: Bearer spur_...'."
                )
            found = super().authenticate(request)  # Authorization: Bearer, or nothing
        else:
            secret = token.strip()
            if not secret or len(secret) > MAX_HEADER or " " in secret:
                raise exceptions.AuthenticationFailed(
                    f"Malformed {TOKEN_HEADER} header: expected the API token (spur_...) alone."
                )
            found = self.authenticate_secret(secret)
        if found is not None and name is not None and name.strip() != found[0].get_username():
            raise exceptions.AuthenticationFailed(
                f"{USER_HEADER} does not name the user of this API token."
            )
        return found

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="slurmrestd"'
