"""`UpdateJob`: an owner changes a pending job's name, time limit, nice, partition or
comment (`scontrol update`; the fields are the contract's `UPDATE_FIELDS`).

The new spec is checked as a submission of it would be (the partition exists and takes
the account, the time limit fits it, the shape is satisfiable), so an update can never
make a job that submit would have refused. Only a pending job changes: what runs keeps
what it was started with, as in Slurm for a user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.contract.request import interned
from scheduler.core.effects import Effect
from scheduler.core.errors import Rejected
from scheduler.core.placement import shape_of, unsatisfiable
from scheduler.core.time_limits import job_time_limit

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState


def update(state: ClusterState, cmd: c.UpdateJob) -> list[Effect]:
    job = state.job(cmd.job_id)
    if job.state is not JobState.PENDING:
        raise Rejected("Job is no longer pending execution", code="not_pending")
    changes = dict(cmd.changes)
    nice = changes.get("nice", 0)
    if isinstance(nice, int) and nice < 0 and not cmd.admin:
        raise Rejected(
            "Access/permission denied: only an operator may set a negative nice",
            code="permission",
        )
    spec = job.spec.replace(**changes)
    partition = job.partition
    if "partition" in changes:
        partition = spec.partition or state.default_partition or ""
    part = state.partitions.get(partition)
    if part is None:
        raise Rejected("Invalid partition name specified", code="invalid_partition")
    if part.allow_accounts and job.account not in part.allow_accounts:
        raise Rejected(
            f"Job's account not permitted to use this partition ({partition} allows "
            f"{', '.join(part.allow_accounts)}; not {job.account})",
            code="account_not_allowed",
        )
    time_limit = job_time_limit(part, spec.time_limit_min)
    shape = shape_of(state, spec, partition)
    if shape != job.shape:
        refusal = unsatisfiable(state, shape)
        if refusal is not None:
            raise Rejected(refusal, code="unsatisfiable")
    job = state.named(cmd.job_id, cmd.now)  # one task of an array, not its remainder
    job.spec, job.partition, job.time_limit_min = spec, partition, time_limit
    job.shape = interned(shape)
    job.reason = state.blocked_reason(job, cmd.now) or "None"
    state.touch(job.job_id)
    return [state.emit(job, "updated", cmd.now)]
