"""Who may open a session's web terminal, and the controller's token for it.

The web terminal's websocket consumer (terminal_consumer.py) asks `terminal_grant` before it
relays anything: the session's own user, or an owner or admin of its organisation (as for
srun into a job, spurcloud/api/steps.py); never a billing member, never another
organisation (the same 404 as a missing session). The grant is the controller's
(`POST /v1/jobs/{id}/terminal/token`): a 60-second token for the job's node, which that
node's agent checks against the job it runs (scheduler/rpc/terminal_tokens.py).

The same people may open the session's web service (its JupyterLab, through
portal/jupyter_proxy.py): `service_grant` is the controller's token of the other kind,
which the agent's proxy takes and its terminal refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404

from scheduler.rpc.errors import Conflict, NotFound, RpcError, Unavailable
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.selectors import access_job
from spurcloud.jobs.services import BILLING_ROLE_MESSAGE
from spurcloud.portal.sessions import template_key
from spurcloud.tenants.models import Membership

NOT_YOURS_MESSAGE = "You can open a terminal only in your own sessions."
NOT_YOURS_WEB_MESSAGE = (
    "Only the session's own user opens its web service: its pages run the session's code."
)


class TerminalUnavailable(Exception):
    """No terminal now: the session is not running, or the scheduler cannot be reached."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def session_access(*, membership: Membership, job_id: int, own_only: bool = False) -> JobRecord:
    """The session, when this member may work in it: its terminal (its own user, owners
    and admins), or with `own_only` its web service (its own user alone: the service's
    pages run the session's code in the portal's origin, in the browser of whoever opens
    them, so an admin opening a member's JupyterLab would run what the member planted)."""
    if not membership.runs_jobs:
        raise PermissionDenied(BILLING_ROLE_MESSAGE)
    record = access_job(organization=membership.organization, job_id=job_id)
    if template_key(record.spec) is None:
        raise Http404(f"Job {job_id} is not a session.")
    if record.user != membership.user.get_username():
        if own_only:
            raise PermissionDenied(NOT_YOURS_WEB_MESSAGE)
        if not membership.manages_organization:
            raise PermissionDenied(NOT_YOURS_MESSAGE)
    return record


def terminal_grant(*, membership: Membership, job_id: int) -> dict[str, Any]:
    """`{"token", "node", "agent_url", "expires"}` for a terminal in the session."""
    session_access(membership=membership, job_id=job_id)
    return _ask(membership, job_id, controller_client().terminal_token)


def service_grant(*, membership: Membership, job_id: int) -> dict[str, Any]:
    """The same for the agent's proxy to the session's web service. The caller checked
    `session_access` (and that the template has a web service)."""
    return _ask(membership, job_id, controller_client().service_token)


def _ask(
    membership: Membership, job_id: int, mint: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    organization, username = membership.organization, membership.user.get_username()
    try:
        return mint(job_id, tenant=organization.slug, user=username)
    except NotFound as exc:
        raise Http404(f"Job {job_id} is not a session.") from exc
    except Conflict as exc:
        raise TerminalUnavailable(f"Session {job_id} is not running.") from exc
    except Unavailable as exc:
        raise TerminalUnavailable(f"The scheduler is unreachable: {exc.message}") from exc
    except RpcError as exc:
        raise TerminalUnavailable(exc.message) from exc
