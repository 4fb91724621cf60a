"""QoS and account limits, checked as a pass starts jobs.

`Usage` counts what running jobs (and the jobs this pass has started) hold per user and
per account; a job that would push one past a limit waits with Slurm's reason for it:
QOSMaxGRESPerUser, QOSMaxJobsPerUserLimit, QOSGrpGRES (the QoS's per-account cap) or
AssocGrpGRES (the account's own cap, Slurm's GrpTRES=gres/gpu).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.core.contract import HOLDS_RESOURCES
from scheduler.core.jobs import Job

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState


@dataclass
class Usage:
    gpus_by_user: Counter[tuple[str, str]] = field(default_factory=Counter)  # (qos, user)
    jobs_by_user: Counter[tuple[str, str]] = field(default_factory=Counter)
    gpus_by_qos_account: Counter[tuple[str, str]] = field(default_factory=Counter)
    gpus_by_account: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, state: ClusterState) -> Usage:
        usage = cls()
        for job in state.jobs.values():
            if job.state in HOLDS_RESOURCES:
                usage.add(job)
        return usage

    def add(self, job: Job) -> None:
        qos = job.qos
        gpus = job.shape.resources.gpus
        self.gpus_by_user[(qos, job.spec.user)] += gpus
        self.jobs_by_user[(qos, job.spec.user)] += 1
        self.gpus_by_qos_account[(qos, job.account)] += gpus
        self.gpus_by_account[job.account] += gpus


def limit_reason(state: ClusterState, job: Job, usage: Usage) -> str | None:
    policy = state.policy
    qos = policy.qos.get(job.qos)
    gpus = job.shape.resources.gpus  # GPU devices (a share counts as one)
    if qos is not None:
        cap = qos.max_gpus_per_user
        if cap is not None and usage.gpus_by_user[(job.qos, job.spec.user)] + gpus > cap:
            return "QOSMaxGRESPerUser"
        cap = qos.max_jobs_per_user
        if cap is not None and usage.jobs_by_user[(job.qos, job.spec.user)] + 1 > cap:
            return "QOSMaxJobsPerUserLimit"
        cap = qos.max_gpus_per_account
        if cap is not None and usage.gpus_by_qos_account[(job.qos, job.account)] + gpus > cap:
            return "QOSGrpGRES"
    cap = policy.account(job.account).grp_gpus
    if cap is not None and usage.gpus_by_account[job.account] + gpus > cap:
        return "AssocGrpGRES"
    return None
