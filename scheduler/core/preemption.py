"""Preemption in a planning pass: for the blocked jobs whose QoS may preempt others, the
running jobs to stop so that they fit (`Preempt` commands, which `lifecycle.preempt`
carries out when the leader commits them).

Apart from the planner because it is its own search: it walks the running jobs, not the
pending queue, and works on a copy of the pass's free map that the pass never sees.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import TYPE_CHECKING

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import Job
from scheduler.core.placement import place
from scheduler.core.priority import Ranker

if TYPE_CHECKING:
    from scheduler.core.policy import Policy
    from scheduler.core.state import ClusterState


def may_preempt(policy: Policy, running_qos: Mapping[str, int] | None) -> bool:
    """Whether a pass may plan a preemption: a QoS preempts another, and (where the
    running jobs are counted by QoS) a job of such a QoS runs."""
    if not any(q.preempt for q in policy.qos.values()):
        return False
    return running_qos is None or any(
        running_qos.get(victim) for q in policy.qos.values() for victim in q.preempt
    )


def plan_preemption(
    state: ClusterState,
    blocked: Iterable[Job],
    free: FreeMap,
    rank: Ranker,
    *,
    now: float,
    cmd_id: str,
    holding: Iterable[Job] | None = None,
    running_qos: Mapping[str, int] | None = None,
) -> list[c.Command]:
    """For blocked jobs (highest first) whose QoS may preempt others: the fewest running
    preemptible jobs, lowest priority and most recently started first, whose resources
    let the job fit. Each victim is planned once per pass."""
    policy = state.policy
    if not may_preempt(policy, running_qos):
        return []
    running: dict[str, list[Job]] = {}
    for j in holding if holding is not None else state.jobs.values():
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
