"""One scheduling pass: who starts now, who waits and why, who is preempted.

`plan_pass` is pure. It ranks the eligible pending jobs by multifactor priority
(priority.py), starts every job that fits (placement.place) within its QoS and account
limits (limits.py) without delaying the reservations of the top blocked jobs
(backfill.py), and plans preemptions for blocked jobs whose QoS may preempt others. The
leader commits the result; `ClusterState.apply` re-checks every placement.

Speed: a pass ranks every pending job, but placement is tried once per *shape* (what a
job asks for) until the pass frees something: once 1-GPU jobs of one partition fail,
the thousands behind them fail without a search.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.core import commands as c
from scheduler.core.backfill import Allocs, Reservation, Timeline, expected_end, releases
from scheduler.core.contract import JobState
from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import Job
from scheduler.core.limits import Usage, limit_reason
from scheduler.core.placement import place, task_mix
from scheduler.core.priority import Factors, Ranker, Weights, ranker

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState


@dataclass
class Plan:
    allocate: c.Allocate | None
    preempt: list[c.Command] = field(default_factory=list)
    factors: dict[int, Factors] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)


def plan(state: ClusterState, *, now: float, cmd_id: str) -> c.Allocate | None:
    return plan_pass(state, now=now, cmd_id=cmd_id).allocate


def plan_pass(state: Any, *, now: float, cmd_id: str, weights: Weights | None = None) -> Plan:
    depth = state.policy.backfill_depth
    rank = ranker(state, now, weights)

    reasons: list[tuple[int, str]] = []

    def wait(job: Job, reason: str) -> None:
        if job.reason != reason:
            reasons.append((job.job_id, reason))

    factors: dict[int, Factors] = {}
    queue: list[tuple[int, int, Job, Hashable]] = []
    alike: dict[Hashable, tuple[Job, int]] = {}  # shape -> (an example, how many)
    for job in state.pending_jobs():
        why = state.blocked_reason(job, now)
        if why:
            wait(job, why)
            continue
        f = rank.factors(job)
        factors[job.job_id] = f
        key = job.shape
        queue.append((-f.priority, job.job_id, job, key))
        example, count = alike.get(key, (job, 0))
        alike[key] = (example, count + 1)
    queue.sort()  # (-priority, job id): ids are unique, so jobs are never compared

    free = state.free_map()
    usage = Usage.of(state)
    failed: set[Hashable] = set()
    refused: dict[Hashable, float] = {}  # shape -> shortest end the timeline refused
    timeline: Timeline | None = None
    reservations: list[Reservation] = []
    started: list[tuple[float, Allocs]] = []  # this pass's starts, for the timeline
    placements: list[c.Placement] = []
    blocked: list[Job] = []
    waiting: set[str] = set()  # partitions with a blocked job already

    # Fragmentation is measured against what is waiting (FGD): the pending jobs' shapes.
    mix = task_mix(alike.values())
    limited_by_policy = state.policy.has_limits

    def placer(job: Job, where: FreeMap) -> Allocs | None:
        return place(state, job, where, mix=mix)

    for _, _, job, key in queue:
        if job.spec.nodelist and any(
            name not in state.nodes or not state.nodes[name].takes_jobs
            for name in job.spec.nodelist
        ):
            wait(job, "ReqNodeNotAvail")  # a node it insists on is down or drained
            continue
        limited = limit_reason(state, job, usage) if limited_by_policy else None
        if limited:
            wait(job, limited)
            continue
        end = now + job.time_limit_min * 60.0 if job.time_limit_min else math.inf
        fits_now = key not in failed
        allocs = None
        if fits_now and (key not in refused or end < refused[key]):
            allocs = place(state, job, free, mix=mix)
            if allocs is None:
                failed.add(key)
                fits_now = False
        if allocs is not None:
            if timeline is None or timeline.admits(allocs, end):
                free.take(allocs)
                if timeline is not None:
                    timeline.hold(allocs, end)
                elif end < math.inf:
                    started.append((end, allocs))
                usage.add(job)
                placements.append(c.Placement(job.job_id, allocs))
                refused.clear()  # what is free changed: another choice may be admitted
                continue
            # The same shape, running as long or longer, lands on the same resources
            # (placement is deterministic) and would be refused the same way.
            refused[key] = min(refused.get(key, math.inf), end)
        # It waits. As Slurm says it: the first blocked job of a partition waits on
        # Resources, the ones behind it on Priority (higher jobs exist). The top blocked
        # jobs also get reservations, which the jobs behind must not delay.
        blocked.append(job)
        if not fits_now and len(reservations) < depth:
            if timeline is None:
                ends = sorted(releases(state, now) + started, key=lambda r: r[0])
                timeline = Timeline(free, ends)
            found = timeline.reserve(job, placer)
            if found is not None:
                reservations.append(found)
        first = job.partition not in waiting
        waiting.add(job.partition)
        wait(job, "Resources" if first else "Priority")

    preempt = plan_preemption(state, blocked, free, rank, now=now, cmd_id=cmd_id)
    allocate = None
    if placements or reasons:
        allocate = c.Allocate(
            cmd_id=cmd_id, now=now, placements=tuple(placements), reasons=tuple(reasons)
        )
    return Plan(allocate, preempt, factors, reservations)


def plan_preemption(
    state: ClusterState,
    blocked: list[Job],
    free: FreeMap,
    rank: Ranker,
    *,
    now: float,
    cmd_id: str,
) -> list[c.Command]:
    """For blocked jobs (highest first) whose QoS may preempt others: the fewest running
    preemptible jobs, lowest priority and most recently started first, whose resources
    let the job fit. Each victim is planned once per pass."""
    policy = state.policy
    if not any(q.preempt for q in policy.qos.values()):
        return []
    running: dict[str, list[Job]] = {}
    for j in state.jobs.values():
        if j.state is JobState.RUNNING:
            running.setdefault(j.qos, []).append(j)
    # QoS names whose blocked jobs have someone running to preempt at all.
    armed = {
        name for name, q in policy.qos.items() if any(running.get(victim) for victim in q.preempt)
    }
    if not armed:
        return []
    taken: set[int] = set()
    hopeless: set[Hashable] = set()  # (shape, qos) that found no victims this pass
    out: list[c.Command] = []
    shadow: FreeMap | None = None  # copied on first use: a copy costs a pass's worth
    for job in blocked:
        qos = policy.qos_named(job.qos)
        if qos is None or qos.name not in armed:
            continue
        key = (job.shape, job.qos)
        if key in hopeless:
            continue
        # Only jobs that rank below it: a requeued victim that outranked its preemptor
        # would take the GPUs back on the next pass, and the two would take turns.
        mine = rank.factors(job).priority
        victims = sorted(
            (
                v
                for name in qos.preempt
                for v in running.get(name, ())
                if v.job_id not in taken and rank.factors(v).priority < mine
            ),
            key=lambda v: (rank.factors(v).priority, -(v.start_time or 0.0), -v.job_id),
        )
        if not victims:
            hopeless.add(key)
            continue
        if shadow is None:
            shadow = free.copy()
        trial = shadow.copy()
        chosen: list[Job] = []
        for victim in victims:
            trial.give(tuple(victim.allocation.items()))
            chosen.append(victim)
            allocs = place(state, job, trial)
            if allocs is not None:
                trial.take(allocs)
                shadow = trial
                taken.update(v.job_id for v in chosen)
                out.append(
                    c.Preempt(
                        cmd_id=f"{cmd_id}/preempt/{job.job_id}",
                        now=now,
                        job_ids=tuple(v.job_id for v in chosen),
                        for_job=job.job_id,
                    )
                )
                break
        else:
            hopeless.add(key)
    return out


__all__ = ["Plan", "plan", "plan_pass", "expected_end"]
