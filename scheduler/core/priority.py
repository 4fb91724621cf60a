"""Multifactor job priority, as Slurm's priority/multifactor plugin computes it.

    priority = w_age·age + w_fairshare·fairshare + w_qos·qos + w_partition·partition
               + w_size·size − nice

Each factor is in [0, 1]:
- age: time eligible, saturating at `max_age_s` (Slurm's PriorityMaxAge, 7 days);
- fairshare: 2^(−usage/shares) of the job's account, with usage and shares normalised
  over all accounts (the classic formula: an account that used exactly its share gets
  0.5, one that used nothing 1.0);
- qos: the QoS priority over the highest QoS priority;
- partition: the partition's priority tier over the highest tier;
- size: the job's GPUs over the cluster's (Slurm's default favours large jobs, which
  would otherwise starve behind small ones).

The factors of every pending job are kept (`Factors`) so `sprio` can show them. The
per-account and per-partition parts are computed once per pass; the per-job work is a
few additions, because a pass ranks tens of thousands of jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from scheduler.core.jobs import Job

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState


@dataclass(frozen=True)
class Weights:
    age: int = 1_000
    fairshare: int = 10_000
    qos: int = 10_000
    partition: int = 10_000
    size: int = 1_000
    max_age_s: float = 7 * 24 * 3600.0


class Factors(NamedTuple):
    # A named tuple, not a dataclass: a pass builds one per pending job (tens of
    # thousands), and tuples are several times cheaper to make.
    age: float
    fairshare: float
    qos: float
    partition: float
    size: float
    nice: int
    priority: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "age": round(self.age, 6),
            "fairshare": round(self.fairshare, 6),
            "qos": round(self.qos, 6),
            "partition": round(self.partition, 6),
            "size": round(self.size, 6),
            "nice": self.nice,
            "priority": self.priority,
        }


def fairshare_factors(
    shares: Mapping[str, float], usage: Mapping[str, float], accounts: Iterable[str]
) -> dict[str, float]:
    """2^(−U/S) per account, with U and S normalised over the accounts that have any."""
    total_shares = sum(shares.values()) or 1.0
    total_usage = sum(usage.values())
    out = {}
    for account in accounts:
        share = shares.get(account, 1.0) / total_shares
        used = usage.get(account, 0.0) / total_usage if total_usage > 0 else 0.0
        out[account] = 2.0 ** (-used / share) if share > 0 else 0.0
    return out


@dataclass(frozen=True)
class Ranker:
    """What a pass needs to rank jobs: everything but the job itself, computed once."""

    now: float
    weights: Weights
    fairshare: Mapping[str, float]  # account -> factor
    qos: Mapping[str, float]  # qos name -> factor
    partition: Mapping[str, float]  # partition name -> factor
    cluster_gpus: int

    def factors(self, job: Job) -> Factors:
        consts = self.constants(job)
        since = job.eligible_time if job.eligible_time is not None else job.submit_time
        return Factors(self.age(since), *consts, self.priority(consts, since))

    def constants(self, job: Job) -> Constants:
        """The factors but age: the same for every job of a ranking class (account,
        QoS, partition, GPU size, nice; `ranking.class_of`)."""
        gpus = job.shape.resources.gpu_milli / 1000
        return (
            self.fairshare.get(job.account, 1.0),
            self.qos.get(job.qos, 0.0),
            self.partition.get(job.partition, 0.0),
            min(1.0, gpus / self.cluster_gpus) if self.cluster_gpus else 0.0,
            job.spec.nice,
        )

    def age(self, since: float) -> float:
        return min(1.0, max(0.0, self.now - since) / self.weights.max_age_s)

    def priority(self, constants: Constants, since: float) -> int:
        """The priority of a job of these constants eligible since then (the kept
        ranking asks it of each class head, without the factors)."""
        w = self.weights
        fairshare, qos, partition, size, nice = constants
        total = (
            w.age * self.age(since)
            + w.fairshare * fairshare
            + w.qos * qos
            + w.partition * partition
            + w.size * size
            - nice
        )
        return max(0, round(total))


Constants = tuple[float, float, float, float, int]  # fair share, QoS, partition, size, nice


def ranker(
    state: ClusterState,
    now: float,
    weights: Weights | None = None,
    *,
    accounts: Iterable[str] | None = None,
) -> Ranker:
    """Build the pass's ranker from the state's policy: QoS priorities, partition tiers,
    account shares and decayed usage. `accounts`: those of every job in the state, where
    the caller keeps them (the ranking index does); else they are read off the jobs."""
    weights = weights or Weights()
    policy = state.policy
    top_qos = max((q.priority for q in policy.qos.values()), default=0)
    qos = {n: (q.priority / top_qos if top_qos > 0 else 0.0) for n, q in policy.qos.items()}

    tiers = {name: float(p.priority_tier) for name, p in state.partitions.items()}
    top_tier = max(tiers.values(), default=0.0)
    partition = {n: (t / top_tier if top_tier > 0 else 0.0) for n, t in tiers.items()}

    # Sorted: the sums over accounts then add in one order, so two passes (a kept
    # ranking's and a full one's) compute the same floats.
    names = sorted(accounts if accounts is not None else {j.account for j in state.jobs.values()})
    shares = {a: float(policy.account(a).shares) for a in names}
    usage = {a: state.usage(a, now) for a in names}
    cluster_gpus = state.cluster_gpus()
    return Ranker(
        now=now,
        weights=weights,
        fairshare=fairshare_factors(shares, usage, names),
        qos=qos,
        partition=partition,
        cluster_gpus=cluster_gpus,
    )
