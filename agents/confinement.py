"""How this agent contains its jobs, built from `[agent]` and checked before it serves.

An agent that cannot contain jobs does not start: bubblewrap missing, no way to give a
job an identity (not root and not `personal`), or a work root that the jobs' identities
cannot reach. Each refusal is a `ConfigError` that says what to change.
"""

from __future__ import annotations

import logging
import os
import shutil
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.identity import Identities, IdentityRefused
from agents.limits import Enforcement
from agents.limits import detect as detect_limits
from agents.sandbox import SYSTEM_DIRS, Bubblewrap
from agents.supervisor import SETPRIV
from agents.workspace import Workspaces
from scheduler.config import AgentConfig, ConfigError

log = logging.getLogger(__name__)

MISSING_BWRAP = (
    "bubblewrap (bwrap) is not installed, and every job runs in its sandbox: "
    "install it (apt-get install bubblewrap, dnf install bubblewrap)"
)


@dataclass(frozen=True)
class Confinement:
    identities: Identities
    sandbox: Bubblewrap
    limits: Enforcement
    work_root: str
    pids_max: int


def confine(agent: AgentConfig, *, config_path: str = "", spool_dir: str = "") -> Confinement:
    executable = shutil.which("bwrap")
    if executable is None:
        raise ConfigError(MISSING_BWRAP)
    try:
        identities = Identities(
            tenancy=agent.tenancy,
            uid_range=agent.uid_range,
            site_users=dict(agent.site_users),
            personal=agent.personal,
        )
    except (IdentityRefused, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    if identities.mode != "personal" and not os.path.exists(SETPRIV):
        raise ConfigError(f"{SETPRIV} (util-linux) is missing: jobs cannot change identity")
    workspaces = Workspaces(agent.work_root)
    try:
        workspaces.prepare()
    except OSError as exc:
        raise ConfigError(f"agent.work_root {agent.work_root}: {exc.strerror}") from exc
    blocked = workspaces.unreachable()
    if blocked is not None and identities.mode != "personal":
        raise ConfigError(
            f"agent.work_root {workspaces.root} cannot be reached by the jobs' identities: "
            f"{blocked} does not let others pass (each directory above it needs o+x); "
            "choose another work_root"
        )
    if identities.mode == "personal":
        log.warning(
            "personal mode: spurd is not root, so every job runs sandboxed as this agent's "
            "own user (uid %d); organisations are kept apart by the sandbox alone",
            os.geteuid(),
        )
    elif identities.mode == "cloud":
        for line in identities.overlapping_subordinate_ids():
            log.warning("agent.uid_range overlaps a subordinate id range (%s)", line)
    limits = detect_limits()
    hidden = hidden_paths(config_path=config_path, spool_dir=spool_dir, extra=agent.sandbox_hide)
    sandbox = Bubblewrap(executable=executable, hidden=hidden, binds=agent.sandbox_binds)
    log.info(
        "jobs: %s tenancy, sandboxed by %s, limits by %s, workspaces under %s",
        identities.mode,
        executable,
        limits.kind,
        workspaces.root,
    )
    return Confinement(identities, sandbox, limits, str(workspaces.root), agent.pids_max)


def hidden_paths(*, config_path: str, spool_dir: str, extra: Sequence[str] = ()) -> list[str]:
    """What no job may see of this agent: its spool, its config file, the directory the
    config lives in unless that is a system directory itself, and the cluster token file."""
    hidden = [p for p in (spool_dir, config_path) if p]
    if config_path:
        directory = os.path.dirname(os.path.abspath(config_path))
        if directory not in ("/", *SYSTEM_DIRS):
            hidden.append(directory)
    tokens = (os.environ.get("SPUR_CLUSTER_TOKEN_FILE"), _token_file(config_path))
    hidden += [p for p in tokens if p]
    return [*hidden, *extra]


def _token_file(config_path: str) -> str:
    try:
        data = tomllib.loads(Path(config_path).read_text()) if config_path else {}
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    value = data.get("cluster", {}).get("token_file", "")
    return value if isinstance(value, str) else ""
