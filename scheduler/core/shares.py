"""What `sshare`, `sacctmgr`, `sprio -w` and `scontrol show topology` read of the
scheduling policy: each account's shares and decayed usage with the fair-share factor
the priority pass gives it (`priority.fairshare_factors`, the one formula), the QoS
table, the priority weights, and the switch tree. Pure: the controller passes the state
and the time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scheduler.core.priority import Weights, fairshare_factors
from scheduler.core.topology import Topology

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState


def policy_report(
    state: ClusterState, now: float, weights: Weights | None = None
) -> dict[str, Any]:
    """`{"accounts": [...], "qos": [...], "weights": {...}}`; accounts are those configured
    and those with jobs or usage, by name."""
    weights = weights or Weights()
    policy = state.policy
    names = sorted(
        set(policy.accounts) | {j.account for j in state.jobs.values()} | set(state.usage_gpu_s)
    )
    shares = {a: float(policy.account(a).shares) for a in names}
    usage = {a: state.usage(a, now) for a in names}
    factors = fairshare_factors(shares, usage, names)
    total_shares = sum(shares.values()) or 1.0
    total_usage = sum(usage.values())
    accounts = []
    for name in names:
        account = policy.account(name)
        accounts.append(
            {
                "account": name,
                "parent": account.parent,
                "shares": account.shares,
                "norm_shares": round(shares[name] / total_shares, 6),
                "usage_gpu_s": round(usage[name], 3),
                "norm_usage": round(usage[name] / total_usage, 6) if total_usage > 0 else 0.0,
                "fairshare": round(factors[name], 6),
                "grp_gpus": account.grp_gpus,
                "max_submit_jobs": account.max_submit_jobs,
            }
        )
    qos = [
        {
            "name": q.name,
            "priority": q.priority,
            "preempt": list(q.preempt),
            "preempt_mode": q.preempt_mode,
            "grace_s": q.grace_s,
            "max_gpus_per_user": q.max_gpus_per_user,
            "max_gpus_per_account": q.max_gpus_per_account,
            "max_jobs_per_user": q.max_jobs_per_user,
        }
        for q in policy.qos.values()
    ]
    # scontrol show topology: each switch, its level, every node under it, its children.
    tree = Topology.from_config(policy.topology)
    switches = [
        {
            "name": sw.name,
            "level": sw.level,
            "nodes": sorted(sw.below),
            "switches": list(sw.switches),
        }
        for sw in tree.switches.values()
    ]
    return {
        "accounts": accounts,
        "switches": switches,
        "qos": qos,
        "default_qos": policy.default_qos,
        "weights": {
            "age": weights.age,
            "fairshare": weights.fairshare,
            "qos": weights.qos,
            "partition": weights.partition,
            "size": weights.size,
            "max_age_s": weights.max_age_s,
        },
    }
