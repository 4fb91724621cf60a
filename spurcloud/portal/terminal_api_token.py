"""The API token a session's web terminal gives its shell, so that the Slurm commands
there (agents/slurm_cli.py: sbatch, squeue, scancel, ...) work as the person at the
keyboard, in the session's organisation.

One per terminal connection, minted when the consumer (terminal_consumer.py) opens the
agent's websocket, for the session's own user when it is they who connect (so the audit
log and `squeue --me` name who acted). An owner or admin in a member's session gets none:
that shell runs as the member's job, among files any member can change (`~/.bashrc` in
the organisation's workspace), where an owner's token could be taken, and a token of the
member's would let the owner act in their name; the commands there say that no token is
set, and the owner may export one of their own. Scopes `read jobs`, never `admin`;
named `session <id> terminal`; expiring at the session's end (its start plus its time
limit), and never later than the longest a session may last from now
(SPUR_SESSION_MAX_MINUTES). It travels to the agent in a header
beside the terminal token and lives in the shell's environment only, never in the job's
spec or environment (which the organisation's members can read).

Revoked when the connection ends, however it ends: the browser leaves, the shell exits,
or the session ends (its end kills the shell, and the agent closes the socket). The
expiry is for what that cannot cover (the web process dies mid-connection): the shell
that held the token is gone by then, since the agent kills it with the socket or the job.

The URL the shell's commands use is the web's as nodes reach it: SPUR_NODE_API_URL when
set, else the one the browser used (its Host, if it is one of ALLOWED_HOSTS).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http.request import split_domain_port, validate_host
from django.utils import timezone

from spurcloud.jobs.selectors import access_job
from spurcloud.portal.sessions import ends_at
from spurcloud.tenants.models import ApiToken, Membership, Scope
from spurcloud.tenants.services import create_api_token, revoke_api_token

SCOPES = frozenset({Scope.READ, Scope.JOBS})
# A session past its time limit (in the kill grace) still gets a token, briefly.
MIN_LIFETIME = timedelta(minutes=1)


def token_name(job_id: int) -> str:
    return f"session {int(job_id)} terminal"


def token_expiry(*, start: datetime | None, time_limit_min: int | None, now: datetime) -> datetime:
    latest = now + timedelta(minutes=settings.SPUR_SESSION_MAX_MINUTES)
    end = ends_at(start or now, time_limit_min) or latest
    return max(min(end, latest), now + MIN_LIFETIME)


def mint_terminal_token(*, membership: Membership, job_id: int) -> tuple[ApiToken, str] | None:
    """A new token and its secret for this terminal connection; None in someone else's
    session, or where the member may create no token (an email not yet confirmed, where
    that is required): the shell then has none, and the commands say so."""
    record = access_job(organization=membership.organization, job_id=job_id)
    if record.user != membership.user.get_username():
        return None
    expires = token_expiry(
        start=record.start_time, time_limit_min=record.time_limit_min, now=timezone.now()
    )
    try:
        return create_api_token(
            user=membership.user,
            organization=membership.organization,
            name=token_name(job_id),
            scopes=SCOPES,
            expires_at=expires,
        )
    except PermissionDenied:
        return None


def revoke_terminal_token(token: ApiToken) -> None:
    revoke_api_token(token=token, by=token.user)


def api_url_for_nodes(scope: Mapping[str, Any]) -> str | None:
    """The web API's URL as the session's node reaches it (see the module's docstring)."""
    if settings.SPUR_NODE_API_URL:
        return str(settings.SPUR_NODE_API_URL).rstrip("/")
    headers = dict(scope.get("headers") or ())
    host = bytes(headers.get(b"host", b"")).decode("latin-1")
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    return f"{scheme}://{host}"
