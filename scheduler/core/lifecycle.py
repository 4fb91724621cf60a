"""What a job may do besides run: holds, requeue, preemption, and why a pending job waits.

Command handlers of `ClusterState`, kept apart to keep each module readable. They see
the state through `JobBook`, the narrow view below: the jobs, the array bookkeeping, the
policy and partitions, and the transition table (`transitions.py`), through which every
change of a job's state goes. `ClusterState.apply` stays the only entry point.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Any, Protocol

from scheduler.core import arrays
from scheduler.core import commands as c
from scheduler.core import dependencies as deps
from scheduler.core.arrays import parse_array
from scheduler.core.contract import JobSpec, JobState
from scheduler.core.effects import Effect
from scheduler.core.errors import Rejected
from scheduler.core.jobs import Job
from scheduler.core.policy import Policy, QoS

PARTITION_PREEMPT_MODES = ("", "off", "requeue", "cancel")


class JobBook(Protocol):
    """What lifecycle reads and changes of the state."""

    @property
    def jobs(self) -> Mapping[int, Job]: ...
    @property
    def array_tasks(self) -> Mapping[int, tuple[int, ...]]: ...
    @property
    def array_active(self) -> Mapping[int, int]: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def partitions(self) -> Mapping[str, c.PartitionDef]: ...

    def job(self, job_id: int) -> Job: ...
    def named(self, job_id: int, now: float) -> Job: ...
    def lookup(self, job_id: int) -> Job | None: ...
    def transition(self, job: Job, to: JobState, now: float, **details: Any) -> list[Effect]: ...
    def set_reason(self, job: Job, reason: str, now: float, kind: str) -> list[Effect]: ...


# -- why a job waits -------------------------------------------------------------------


def blocked_reason(state: JobBook, job: Job, now: float) -> str | None:
    """A reason the job may not start whatever the resources, in Slurm's precedence:
    holds, then dependencies, then the begin time, then the array throttle."""
    if job.hold == "admin":
        return "JobHeldAdmin"
    if job.hold == "user":
        return "JobHeldUser"
    if job.depends is not None:
        verdict = deps.verdict(job.depends, dependency_statuses(state, job, now))
        if verdict == deps.FAILED:
            return "DependencyNeverSatisfied"
        if verdict == deps.UNFULFILLED:
            return "Dependency"
    if job.spec.begin_time is not None and now < job.spec.begin_time:
        return "BeginTime"
    if (
        job.array_throttle
        and job.array_job_id is not None
        and state.array_active.get(job.array_job_id, 0) >= job.array_throttle
    ):
        return "JobArrayTaskLimit"
    return None


def wake_time(state: JobBook, job: Job, now: float) -> float | None:
    """When a blocked job's reason may change with time alone (its begin time, or an
    `after:N+min` delay running out), or None: then only a command changes it."""
    if job.hold:
        return None  # a release comes first, and is a command
    times = []
    if job.spec.begin_time is not None and job.spec.begin_time > now:
        times.append(job.spec.begin_time)
    for term in job.depends.terms if job.depends is not None else ():
        if term.kind != "after":
            continue
        for target in targets(state, term, job) or ():
            if not target.state.is_terminal and target.start_time is not None:
                at = target.start_time + 60 * term.delay_min
                if at > now:
                    times.append(at)
    return min(times, default=None)


def dependency_statuses(state: JobBook, job: Job, now: float) -> list[tuple[deps.DepTerm, str]]:
    if job.depends is None:
        return []
    return deps.statuses(
        job.depends,
        job,
        lambda term: targets(state, term, job),
        now,
        lambda j: singleton_blocked(state, j),
    )


def targets(state: JobBook, term: deps.DepTerm, job: Job | None = None) -> list[Job] | None:
    """The jobs a dependency term names (all tasks of an array job), or None if unknown.
    An array's pending remainder counts once for all its tasks (they are alike: pending,
    never started), except where one task is named: by `12_3`, or by aftercorr for the
    task of `job`'s index."""
    tasks = state.array_tasks.get(term.job_id)
    if tasks is None:  # a job, or one task by its own job id
        found = state.lookup(term.job_id)
        if found is not None and found.array_pending:
            found = arrays.task_of(found, found.job_id)  # the task, not its remainder
        return None if found is None else [found]
    task = term.task
    if task is None and term.kind == "aftercorr" and job is not None:
        task = job.array_task_id
    if task is not None:
        one = _task(state, term.job_id, tasks, task)
        if one is not None or term.task is not None:
            return None if one is None else [one]
    every = [state.jobs[t] for t in tasks if t in state.jobs]
    return every or None


def _task(state: JobBook, array_id: int, tasks: tuple[int, ...], task: int) -> Job | None:
    """Task `task` of the array `array_id` (whose job ids are `tasks`), wherever it is."""
    sample = next((state.jobs[t] for t in tasks if t in state.jobs), None)
    if sample is None:
        return None
    ids = arrays.task_ids(sample.spec.array)
    k = bisect_left(ids, task)
    if k == len(ids) or ids[k] != task:
        return None
    found = state.lookup(array_id + k)  # None once purged
    if found is not None and found.array_pending:
        found = arrays.task_of(found, found.job_id)
    return found


def singleton_blocked(state: JobBook, job: Job) -> bool:
    # Only earlier jobs block, so that of two pending singletons the older one goes first
    # and they never start together.
    return any(
        other.job_id < job.job_id
        and other.state.is_active
        and other.spec.user == job.spec.user
        and other.spec.name == job.spec.name
        for other in state.jobs.values()
    )


# -- submit-time checks ---------------------------------------------------------------


def check_submission(
    state: JobBook, spec: JobSpec
) -> tuple[QoS, str, deps.Dependency | None, tuple[int | None, ...], int]:
    """Refuse what can never be valid; return the QoS, account, parsed dependency,
    array task ids (`(None,)` for a plain job) and throttle."""
    policy = state.policy
    qos = policy.qos_named(spec.qos)
    if qos is None:
        raise Rejected(f"Invalid qos specification: {spec.qos}", code="invalid_qos")
    account = spec.account or spec.tenant or "root"
    if spec.account and not policy.knows_account(spec.account, spec.tenant):
        raise Rejected(
            f"Invalid account or account/partition combination specified: {spec.account}",
            code="invalid_account",
        )
    dependency = deps.parse_dependency(spec.dependency)
    for term in dependency.terms if dependency else ():
        if term.kind == "singleton":
            continue
        named = targets(state, term)
        # Another organisation's job is unknown to this one: the same answer as a job
        # that does not exist, so a dependency cannot tell how a stranger's job ended.
        if named is None or any(j.spec.tenant != spec.tenant for j in named):
            raise Rejected(
                f"{deps.BAD_DEPENDENCY}: job {term.job_id}"
                + (f"_{term.task}" if term.task is not None else "")
                + " is unknown",
                code="invalid_dependency",
            )
    tasks: tuple[int | None, ...] = (None,)
    throttle = 0
    if spec.array:
        tasks, throttle = parse_array(spec.array)
    # `--gres=shard:N` stays in the spec: placement converts it with `shards_per_gpu`.
    return qos, account, dependency, tasks, throttle


# -- holds and requeue ----------------------------------------------------------------------


def hold(state: JobBook, cmd: c.HoldJob) -> list[Effect]:
    job = state.job(cmd.job_id)
    if job.state is not JobState.PENDING:
        raise Rejected("Job is no longer pending execution", code="not_pending")
    job = state.named(cmd.job_id, cmd.now)  # one task of an array, not its remainder
    # An admin hold is not weakened by a user hold on top of it.
    job.hold = "admin" if cmd.admin or job.hold == "admin" else "user"
    return state.set_reason(job, blocked_reason(state, job, cmd.now) or "None", cmd.now, "held")


def release(state: JobBook, cmd: c.ReleaseJob) -> list[Effect]:
    job = state.job(cmd.job_id)
    if not job.hold:
        return []
    if job.hold == "admin" and not cmd.admin:
        raise Rejected(
            "Access/permission denied: the job is held by an administrator", code="permission"
        )
    job = state.named(cmd.job_id, cmd.now)
    job.hold = ""
    if job.state is not JobState.PENDING:
        return []
    return state.set_reason(job, blocked_reason(state, job, cmd.now) or "None", cmd.now, "released")


def requeue(state: JobBook, cmd: c.RequeueJob) -> list[Effect]:
    job = state.job(cmd.job_id)
    if job.state not in (JobState.RUNNING, JobState.SUSPENDED):
        raise Rejected(f"job {job.job_id} is not running: nothing to requeue", code="not_running")
    if job.spec.requeue is False:
        raise Rejected(
            "Requested operation is presently disabled: the job was submitted with --no-requeue",
            code="not_requeueable",
        )
    if cmd.hold:
        job.hold = "user"
    return state.transition(
        job, JobState.COMPLETING, cmd.now, end_state=JobState.PENDING, kind="requeueing"
    )


# -- suspend and resume (operators only) ----------------------------------------------------

# Slurm's words (slurm_strerror) for what scontrol suspend/resume refuse, by the job's state.
NOT_STARTED = "Job is pending execution"
NOT_SUSPENDED = "Job is not suspended"
ALREADY_ENDED = "Job/step already completing or completed"
PERMISSION = "Access/permission denied"


def suspend(state: JobBook, cmd: c.SuspendJob) -> list[Effect]:
    job = _operators_job(state, cmd.job_id, admin=cmd.admin)
    if job.state is JobState.SUSPENDED:
        return []  # Slurm: suspending a suspended job succeeds and does nothing
    if job.state is not JobState.RUNNING:
        raise _not_active(job)
    return state.transition(job, JobState.SUSPENDED, cmd.now)


def resume(state: JobBook, cmd: c.ResumeJob) -> list[Effect]:
    job = _operators_job(state, cmd.job_id, admin=cmd.admin)
    if job.state is JobState.RUNNING:
        raise Rejected(NOT_SUSPENDED, code="not_suspended")
    if job.state is not JobState.SUSPENDED:
        raise _not_active(job)
    return state.transition(job, JobState.RUNNING, cmd.now)


def _operators_job(state: JobBook, job_id: int, *, admin: bool) -> Job:
    job = state.job(job_id)
    if not admin:
        raise Rejected(PERMISSION, code="permission")
    return job


def _not_active(job: Job) -> Rejected:
    if job.state is JobState.PENDING:
        return Rejected(NOT_STARTED, code="not_running")
    return Rejected(ALREADY_ENDED, code="not_running")


# -- preemption -------------------------------------------------------------------------


def preempt(state: JobBook, cmd: c.Preempt) -> list[Effect]:
    target = state.lookup(cmd.for_job)  # a task of a remainder: read, not split
    if target is None or target.state is not JobState.PENDING:
        return []  # a stale plan: the job it made room for started or went away
    victims: list[tuple[Job, str]] = []
    for job_id in dict.fromkeys(cmd.job_ids):
        victim = state.jobs.get(job_id)
        if victim is None or victim.state is not JobState.RUNNING:
            continue  # ended or already stopping since the plan was made
        mode = preempt_mode(state, target, victim)
        if mode is None:
            raise Rejected(
                f"job {target.job_id} may not preempt job {victim.job_id}",
                code="not_preemptible",
            )
        victims.append((victim, mode))
    effects: list[Effect] = []
    for victim, mode in victims:
        qos = state.policy.qos_named(victim.qos)
        grace = qos.grace_s if qos is not None else 0.0
        # A job submitted --no-requeue is never requeued: preempted, it ends PREEMPTED.
        requeue = mode == "requeue" and victim.spec.requeue is not False
        end = JobState.PENDING if requeue else JobState.PREEMPTED
        effects.extend(
            state.transition(
                victim,
                JobState.COMPLETING,
                cmd.now,
                end_state=end,
                kind="preempting",
                grace_s=grace,
            )
        )
    return effects


def preempt_mode(state: JobBook, target: Job, victim: Job) -> str | None:
    """How `target` may preempt `victim` ("requeue" or "cancel"), or None if it may not:
    by QoS (the target's QoS lists the victim's), or by partition tier (a higher tier
    preempts a lower one whose partition has a preempt mode)."""
    part = state.partitions.get(victim.partition)
    part_mode = part.preempt_mode if part is not None else ""
    if part_mode == "off" or target.job_id == victim.job_id:
        return None
    if state.policy.may_preempt(target.qos, victim.qos):
        qos = state.policy.qos_named(victim.qos)
        return part_mode or (qos.preempt_mode if qos is not None else "requeue")
    target_part = state.partitions.get(target.partition)
    if (
        part is not None
        and target_part is not None
        and part_mode
        and target_part.priority_tier > part.priority_tier
    ):
        return part_mode
    return None


__all__ = [
    "blocked_reason",
    "check_submission",
    "hold",
    "preempt",
    "release",
    "requeue",
    "resume",
    "suspend",
]
