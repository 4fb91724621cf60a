"""Operator writes to the cluster's nodes: drain (no new job goes there, what runs there
runs on) and resume, as `scontrol update NodeName=x State=DRAIN|RESUME` does. Staff
only: a node is the platform's, not an organisation's, so there is no organisation's
audit log to write to; each change is logged with who made it, and the controller keeps
the reason on the node for everyone to read (sinfo -R, the nodes pages)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied

from spurcloud.jobs.controller import controller_client

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

log = logging.getLogger(__name__)

OPERATORS_ONLY = "Only operators (staff) can drain or resume nodes."


def _operator(user: AbstractBaseUser | AnonymousUser) -> str:
    if not getattr(user, "is_staff", False):
        raise PermissionDenied(OPERATORS_ONLY)
    return str(user.get_username())


def drain_node(*, user: AbstractBaseUser | AnonymousUser, node: str, reason: str) -> dict[str, Any]:
    """Drains `node` with `reason` (1 to MAX_NODE_REASON printable characters; the
    controller checks it, and refuses an unknown node with 404). The node as it is now."""
    by = _operator(user)
    answer = controller_client().drain_node(node, reason=reason.strip(), by=by)
    log.info("node %s drained by %s: %s", node, by, reason)
    return answer


def resume_node(*, user: AbstractBaseUser | AnonymousUser, node: str) -> dict[str, Any]:
    by = _operator(user)
    answer = controller_client().resume_node(node, by=by)
    log.info("node %s resumed by %s", node, by)
    return answer
