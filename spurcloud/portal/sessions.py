"""Interactive sessions: what a session template is, the job a session is, and the
lifecycle the portal shows for it.

A session is an ordinary scheduler job in the QoS `interactive` (scheduler/core/policy.py)
whose batch script holds the allocation: it runs the template's setup, starts the
template's service in the background (JupyterLab), says it is ready on stdout, and sleeps
until its maximum duration, which is also the job's time limit (the scheduler ends it
there whatever the script does). Its comment names the template (`spur-session:<key>`), so
the portal tells a session from a batch job without a table of its own.

Templates: the built-in ones below, plus those an operator lists in the setting
`SPUR_SESSION_TEMPLATES` (a JSON file named by `SPUR_SESSION_TEMPLATES_FILE`): a list of
objects with `key`, `title`, and optionally `description`, `setup` and `service` (shell
command lines) and `web` (what the service serves, "JupyterLab": the session page links to
it). A listed key replaces the built-in one of the same key.

A service with `web` listens on no port: on the Unix socket `$SPUR_SESSION_SOCKET` (in the
job's run directory, agents/service_proxy.py), under the base URL
`$SPUR_SESSION_BASE_URL` (`/sessions/<id>/jupyter/`), where the portal's authenticated
proxy (portal/jupyter_proxy.py) reaches it through the job's agent."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agents.service_proxy import socket_name
from scheduler.core.contract import JobState

QOS = "interactive"
COMMENT_PREFIX = "spur-session:"
READY_LINE = "spur-session: ready"
KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
# In the script, of the job it is: the agent's name for the socket, the proxy's URL.
SOCKET_PATTERN = socket_name("$SLURM_JOB_ID")
WEB_PREFIX = "/sessions/{job_id}/jupyter/"  # where the portal serves it (jupyter_proxy.py)
BASE_URL_PATTERN = WEB_PREFIX.format(job_id="$SLURM_JOB_ID")


@dataclass(frozen=True)
class SessionTemplate:
    key: str
    title: str
    description: str = ""
    setup: str = ""  # run first, in the foreground (the session is "starting" meanwhile)
    service: str = ""  # run in the background for the session's life ("" for none)
    web: str = ""  # the service's web app, served on $SPUR_SESSION_SOCKET ("" for none)

    def script(self, max_minutes: int) -> str:
        """The batch script of a session of this template, lasting at most max_minutes."""
        lines = ["#!/bin/sh", f"# Spur-Cloud interactive session: {self.key}"]
        lines.append(f"echo {shlex.quote(f'spur-session: starting {self.key}')}")
        # Before setup, which may change directory: the agent looks in the run directory.
        lines.append(f'SPUR_SESSION_SOCKET="$PWD/{SOCKET_PATTERN}"')
        lines.append(f'SPUR_SESSION_BASE_URL="{BASE_URL_PATTERN}"')
        lines.append("export SPUR_SESSION_SOCKET SPUR_SESSION_BASE_URL")
        if self.setup:
            lines.append(self.setup)
        if self.service:
            lines.append(f"( {self.service} ) &")
        lines.append(f"echo {shlex.quote(READY_LINE)}")
        # The time limit ends the job at max_minutes; the sleep only holds the allocation.
        lines.append(f"exec sleep {max_minutes * 60 + 60}")
        return "\n".join(lines) + "\n"


BUILTIN_TEMPLATES = (
    SessionTemplate(
        key="shell",
        title="Shell",
        description="A terminal on the GPU node, in the job's sandbox, as your organisation.",
    ),
    SessionTemplate(
        key="pytorch-jupyter",
        title="PyTorch + JupyterLab",
        description=(
            "JupyterLab on the node, reached through the portal only, "
            "for the PyTorch installed in the node's image."
        ),
        # No token of its own: only the organisation's identity can reach the socket, and
        # the portal's proxy lets through only those who may (portal/jupyter_proxy.py).
        service=(
            'exec jupyter lab --no-browser --sock "$SPUR_SESSION_SOCKET"'
            ' --ServerApp.base_url="$SPUR_SESSION_BASE_URL"'
            " --IdentityProvider.token= --ServerApp.password="
            " --ServerApp.allow_remote_access=True"
        ),
        web="JupyterLab",
    ),
)


def _template(data: Any, where: str) -> SessionTemplate:
    names = {f.name for f in fields(SessionTemplate)}
    if not isinstance(data, dict) or not set(data) <= names:
        raise ImproperlyConfigured(f"{where}: an object with only {', '.join(sorted(names))}")
    if not all(isinstance(v, str) for v in data.values()):
        raise ImproperlyConfigured(f"{where}: every value is a string")
    if not KEY_RE.match(data.get("key", "")) or not data.get("title"):
        raise ImproperlyConfigured(f"{where}: a key ({KEY_RE.pattern}) and a title are required")
    return SessionTemplate(**data)


def session_templates() -> dict[str, SessionTemplate]:
    """Every template by key: the built-in ones, then the operator's."""
    found = {t.key: t for t in BUILTIN_TEMPLATES}
    extra = getattr(settings, "SPUR_SESSION_TEMPLATES", None) or []
    if not isinstance(extra, list):
        raise ImproperlyConfigured("SPUR_SESSION_TEMPLATES: a list of templates")
    for i, data in enumerate(extra):
        template = _template(data, f"SPUR_SESSION_TEMPLATES[{i}]")
        found[template.key] = template
    return found


def template_key(spec: dict[str, Any] | None) -> str | None:
    """The template a job's spec names when it is a session, else None."""
    if not spec or spec.get("qos") != QOS:
        return None
    comment = str(spec.get("comment") or "")
    return comment[len(COMMENT_PREFIX) :] if comment.startswith(COMMENT_PREFIX) else None


class Phase(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    ENDED = "ended"


def phase(state: str, *, ready: bool) -> Phase:
    """A session's lifecycle from its job's state, and whether its script said it is
    ready (its READY_LINE on stdout)."""
    job_state = JobState(state)
    if job_state is JobState.PENDING:
        return Phase.PENDING
    if job_state is JobState.COMPLETING:
        return Phase.STOPPING
    if job_state.is_terminal:
        return Phase.ENDED
    return Phase.RUNNING if ready else Phase.STARTING  # RUNNING, or SUSPENDED


def ends_at(start: datetime | None, time_limit_min: int | None) -> datetime | None:
    if start is None or not time_limit_min:
        return None
    return start + timedelta(minutes=time_limit_min)


def warn_before_end(end: datetime | None, now: datetime) -> bool:
    """Whether the page warns that the session ends soon."""
    if end is None:
        return False
    return now < end <= now + timedelta(minutes=int(settings.SPUR_SESSION_WARN_MIN))
