"""`SubmitJob`: a job, or an array's tasks as one pending record (arrays.py), checked as
Slurm checks a submission (EnforcePartLimits=ALL: what no state could run is refused).
A command handler of `ClusterState`, apart from the state to keep each module readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.core import commands as c
from scheduler.core import lifecycle
from scheduler.core.effects import Effect
from scheduler.core.errors import Rejected
from scheduler.core.jobs import Job
from scheduler.core.placement import shape_of
from scheduler.core.time_limits import job_time_limit

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState


def submit(state: ClusterState, cmd: c.SubmitJob) -> list[Effect]:
    if cmd.cmd_id in state.submissions:
        return []
    spec = cmd.spec
    if not state.partitions:
        raise Rejected("the cluster has no partitions configured yet", code="unavailable")
    partition = spec.partition or state.default_partition or ""
    part = state.partitions.get(partition)
    if part is None:
        raise Rejected("Invalid partition name specified", code="invalid_partition")
    time_limit = job_time_limit(part, spec.time_limit_min)
    qos, account, depends, tasks, throttle = lifecycle.check_submission(state, spec)
    if part.allow_accounts and account not in part.allow_accounts:
        raise Rejected(
            f"Job's account not permitted to use this partition ({partition} allows "
            f"{', '.join(part.allow_accounts)}; not {account})",
            code="account_not_allowed",
        )
    shape = shape_of(state, spec, partition)
    check_account_limits(state, account, len(tasks), shape.resources.gpus)
    refusal = state.refusal(shape)
    if refusal is not None:
        raise Rejected(refusal, code="unsatisfiable")
    # A dependency on one task of an array names that task: it leaves the remainder.
    for term in depends.terms if depends else ():
        one = term.task is not None or term.job_id not in state.array_tasks
        if term.kind != "singleton" and one:
            for target in lifecycle.targets(state, term) or ():
                if state.jobs.get(target.job_id) is not target:
                    state.named(target.job_id, cmd.now)
    first = state.next_job_id
    arrayed = tasks != (None,)
    job = Job(
        job_id=first,
        spec=spec,
        partition=partition,
        account=account,
        time_limit_min=time_limit,
        submit_time=cmd.now,
        eligible_time=max(cmd.now, spec.begin_time or cmd.now),
        qos=qos.name,
        array_job_id=first if arrayed else None,
        array_task_id=tasks[0],
        array_throttle=throttle,
        # An array's pending tasks are one record (arrays.py); the task ids past the
        # first are reserved, not made.
        array_pending=tuple(range(first + 1, first + len(tasks))),
        depends=depends,
        hold="user" if spec.hold else "",
        shards_per_gpu=state.policy.shards_per_gpu,
    )
    state.jobs[first] = job
    state.touch(first)
    job.reason = state.blocked_reason(job, cmd.now) or "None"
    state.next_job_id += len(tasks)
    state.waiting[account] = state.waiting.get(account, 0) + len(tasks)
    if arrayed:
        state.array_tasks[first] = tuple(range(first, first + len(tasks)))
        if job.array_pending:
            state.remainders.set(first, first)
    state.submissions[cmd.cmd_id] = first
    effects: list[Effect] = [state.emit(job, "submitted", cmd.now)]
    if depends is not None and any(t.kind == "aftercorr" for t in depends.terms):
        # Each task waits on its own counterpart: they are jobs of their own at once.
        for job_id in job.array_pending[::-1]:
            state.named(job_id, cmd.now)
        state.named(first, cmd.now)
    return effects


def check_account_limits(state: ClusterState, account: str, jobs: int, gpus: int) -> None:
    """Slurm's MaxSubmitJobs (jobs waiting at once) and a GrpTRES=gres/gpu that this
    job alone passes (it could never start): refused at submit, before any change."""
    limits = state.policy.account(account)
    cap = limits.max_submit_jobs
    if cap is not None and state.waiting.get(account, 0) + jobs > cap:
        raise Rejected(
            "Job violates accounting/QOS policy (job submit limit, user's size and/or "
            f"time limits): account {account} may have {cap} jobs waiting and has "
            f"{state.waiting.get(account, 0)}",
            code="AssocMaxSubmitJobLimit",
        )
    if limits.grp_gpus is not None and gpus > limits.grp_gpus:
        raise Rejected(
            "Job violates accounting/QOS policy (job submit limit, user's size and/or "
            f"time limits): {gpus} GPUs asked, account {account} may hold "
            f"{limits.grp_gpus}",
            code="AssocGrpGRES",
        )
