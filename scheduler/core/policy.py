"""Scheduling policy as replicated state: QoS, accounts, and the knobs of the scheduler.

The leader commits it from `spur.toml` with a `ConfigurePolicy` command (as partitions),
so every replica plans and checks against the same policy, and a config change is a
point in the log rather than a difference between machines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.core.errors import Rejected

PREEMPT_MODES = ("requeue", "cancel")
DAY_S = 86400.0


@dataclass(frozen=True)
class QoS:
    name: str
    priority: int = 0
    preempt: tuple[str, ...] = ()  # the QoS names jobs of this QoS may preempt
    preempt_mode: str = "requeue"  # what happens to a job of this QoS when preempted
    grace_s: float = 30.0  # SIGTERM, then SIGKILL after this long (Slurm's GraceTime)
    max_gpus_per_user: int | None = None
    max_gpus_per_account: int | None = None
    max_jobs_per_user: int | None = None


@dataclass(frozen=True)
class Account:
    name: str
    shares: int = 1
    grp_gpus: int | None = None  # GrpTRES=gres/gpu=N: GPUs its running jobs may hold
    parent: str = ""
    max_submit_jobs: int | None = None  # MaxSubmitJobs: jobs it may have waiting at once


DEFAULT_QOS = (
    # normal outranks spot: a job preempts only jobs that rank below it, and the spot
    # job it requeues must not take its GPUs back on the next pass.
    QoS(name="normal", priority=10, preempt=("spot",)),
    QoS(name="spot", priority=0, preempt_mode="requeue"),
    # The portal's interactive sessions (a terminal, JupyterLab): someone is waiting at
    # the screen, so they rank above batch work; they preempt only spot jobs, and a
    # preempted session is cancelled (a requeued terminal would come back empty).
    QoS(name="interactive", priority=20, preempt=("spot",), preempt_mode="cancel"),
)


def _default_qos() -> dict[str, QoS]:
    return {q.name: q for q in DEFAULT_QOS}


@dataclass(frozen=True)
class Policy:
    # By name, in config order. Dicts are never hashed here, and compare by value, so a
    # frozen dataclass holding them still compares equal across replicas.
    qos: dict[str, QoS] = field(default_factory=_default_qos)
    accounts: dict[str, Account] = field(default_factory=dict)
    default_qos: str = "normal"
    shards_per_gpu: int = 8
    fairshare_half_life_s: float = 7 * DAY_S
    # Reservations per pass (Slurm's bf_max_job_test is 100, spread over a backfill
    # cycle of its own; we plan in every pass, so fewer: each costs placements).
    backfill_depth: int = 16
    # The `[topology]` table of spur.toml, passed through untouched: placement reads it
    # (`ClusterState.topology`). Never hashed, so a dict is fine in a frozen dataclass.
    topology: dict[str, Any] = field(default_factory=dict)
    # The limits of every account not configured by name: each organisation (tenant)
    # arrives through the web app with an account of its own.
    account_defaults: Account = field(
        default_factory=lambda: Account(name="", max_submit_jobs=10_000)
    )

    @classmethod
    def of(
        cls, qos: Iterable[QoS] = DEFAULT_QOS, accounts: Iterable[Account] = (), **kw: Any
    ) -> Policy:
        return cls(qos={q.name: q for q in qos}, accounts={a.name: a for a in accounts}, **kw)

    @property
    def has_limits(self) -> bool:
        """Whether any QoS or account caps GPUs or jobs (a pass skips the checks if not)."""
        return any(
            q.max_gpus_per_user is not None
            or q.max_gpus_per_account is not None
            or q.max_jobs_per_user is not None
            for q in self.qos.values()
        ) or any(a.grp_gpus is not None for a in self.accounts.values())

    def qos_named(self, name: str) -> QoS | None:
        return self.qos.get(name or self.default_qos)

    def account(self, name: str) -> Account:
        """The configured account, or the implicit one every tenant has (its limits are
        `account_defaults`)."""
        return self.accounts.get(name) or replace(self.account_defaults, name=name)

    def knows_account(self, name: str, tenant: str) -> bool:
        # A tenant's own account (its name) always exists: tenants arrive through the
        # web app, long after the controller's config was written.
        return name in (tenant, "root") or name in self.accounts

    def may_preempt(self, qos: str, victim_qos: str) -> bool:
        q = self.qos_named(qos)
        victim = self.qos_named(victim_qos)
        return q is not None and victim is not None and victim.name in q.preempt

    def to_dict(self) -> dict[str, Any]:
        return {
            "qos": [vars(q) for q in self.qos.values()],
            "accounts": [vars(a) for a in self.accounts.values()],
            "default_qos": self.default_qos,
            "shards_per_gpu": self.shards_per_gpu,
            "fairshare_half_life_s": self.fairshare_half_life_s,
            "backfill_depth": self.backfill_depth,
            "topology": self.topology,
            "account_defaults": vars(self.account_defaults),
        }


def check_policy(policy: Policy) -> None:
    """Refuse a policy that contradicts itself; the state keeps its old one."""
    names = list(policy.qos)
    if not names or "" in names or any(k != q.name for k, q in policy.qos.items()):
        raise Rejected("every QoS needs a unique name")
    if policy.default_qos not in names:
        raise Rejected(f"the default QoS {policy.default_qos!r} is not defined")
    for q in policy.qos.values():
        unknown = sorted(set(q.preempt) - set(names))
        if unknown:
            raise Rejected(f"QoS {q.name} preempts unknown QoS: {', '.join(unknown)}")
        if q.preempt_mode not in PREEMPT_MODES:
            raise Rejected(f"QoS {q.name}: preempt_mode must be requeue or cancel")
        if q.grace_s < 0:
            raise Rejected(f"QoS {q.name}: grace_s must not be negative")
        for limit in (q.max_gpus_per_user, q.max_gpus_per_account, q.max_jobs_per_user):
            if limit is not None and limit < 0:
                raise Rejected(f"QoS {q.name}: limits must not be negative")
    accounts = list(policy.accounts)
    if "" in accounts or any(k != a.name for k, a in policy.accounts.items()):
        raise Rejected("every account needs a unique name")
    for a in (*policy.accounts.values(), policy.account_defaults):
        if a.max_submit_jobs is not None and a.max_submit_jobs < 1:
            raise Rejected(f"account {a.name or '(defaults)'}: max_submit_jobs must be at least 1")
    for a in policy.accounts.values():
        if a.shares < 1:
            raise Rejected(f"account {a.name}: shares must be at least 1")
        if a.grp_gpus is not None and a.grp_gpus < 0:
            raise Rejected(f"account {a.name}: grp_gpus must not be negative")
        if a.parent and a.parent not in accounts and a.parent != "root":
            raise Rejected(f"account {a.name}: unknown parent {a.parent}")
    for a in policy.accounts.values():
        seen = {a.name}
        parent = a.parent
        while parent and parent in policy.accounts:
            if parent in seen:
                raise Rejected(f"account {a.name}: its parents form a cycle")
            seen.add(parent)
            parent = policy.accounts[parent].parent
    if policy.shards_per_gpu < 1:
        raise Rejected("shards_per_gpu must be at least 1")
    if policy.fairshare_half_life_s <= 0:
        raise Rejected("the fair-share half-life must be positive")
    if policy.backfill_depth < 0:
        raise Rejected("backfill_depth must not be negative")


__all__ = ["Account", "Policy", "QoS", "check_policy", "DEFAULT_QOS", "PREEMPT_MODES"]
