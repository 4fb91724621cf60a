"""One scheduling pass: who starts now, who waits and why, who is preempted.

`plan_pass` is pure. It ranks the eligible pending jobs by multifactor priority
(priority.py), starts every job that fits (placement.place) within its QoS and account
limits (limits.py) without delaying the reservations of the top blocked jobs
(backfill.py), and plans preemptions for blocked jobs whose QoS may preempt others
(preemption.py). The leader commits the result; `ClusterState.apply` re-checks every placement.

Speed: a pass does work for what changed and for the head of the queue, not for every
pending job. The ranking is kept between passes (`ranking.py`) and merged lazily; the
blocked jobs (held, dependent, ...) are out of it until a command or the time lets them
start, and a pass only states the reasons that changed. Placement
is tried once per *shape* (what a job asks for): a shape that failed fails again, as
what is free only shrinks during a pass. Every `check_every` jobs the pass asks whether
the rest of the queue is *inert* (each shape left failed and may not reserve, or was
refused for jobs running as long; a shape not met yet is tried once, ahead of its jobs):
then it stops, and gives a new reason only to the jobs whose reason is not "Priority".
`plan_pass(..., full=True)` ranks every job from scratch and walks them all: the
reference the property tests hold the kept pass to.

An array's pending remainder is walked task by task, each where a job of its own would
stand; its reason is the reason of its first task the pass did not start (the one that
stands for the rest once the started ones left). A pass counts the tasks it starts of
each array against its `%N` throttle, and the rest of that array waits.

Start estimates (`squeue --start`): a reservation is when and where the pass expects a
blocked job to start. A pass makes them only when a lower job asks to start beside
them, so a pass in which nothing fits after a blocked job has none; `estimate=True`
makes the ones it deferred at the end of the pass, which changes nothing it decided
(nothing is walked after) and costs a timeline. The leader asks for it every few
seconds, as Slurm's backfill cycle sets its StartTimes every `bf_interval`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from scheduler.core import commands as c
from scheduler.core.arrays import task_of, tasks_of
from scheduler.core.backfill import Allocs, Reservation, Timeline, expected_end, releases
from scheduler.core.contract import JobShape, JobState
from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import Job
from scheduler.core.limits import Usage, limit_reason
from scheduler.core.placement import place, place_shape, task_mix
from scheduler.core.preemption import may_preempt, plan_preemption
from scheduler.core.priority import Factors, Ranker, Weights, ranker
from scheduler.core.ranking import Group, Ranked, rank_key, since, startable

if TYPE_CHECKING:
    from scheduler.core.ranking import PendingIndex
    from scheduler.core.state import ClusterState


@dataclass
class Plan:
    allocate: c.Allocate | None
    preempt: list[c.Command] = field(default_factory=list)
    # The priority factors of every eligible pending job (sprio). A kept-ranking pass
    # computes them when asked (`PassFactors`), not 50,000 per pass.
    factors: Mapping[int, Factors] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)
    # Whether `reservations` holds every one the pass could make (`estimate`): then they
    # are its start estimates, and a job without one has none.
    estimated: bool = False


@dataclass
class Queue:
    """What a pass walks: the eligible pending tasks in rank order, and what goes with them."""

    rank: Ranker
    ordered: Iterator[Ranked]
    shapes: dict[JobShape, int]  # eligible tasks by shape: the FGD task mix
    # Eligible tasks by (shape, time limit), for stopping early; None: walk every one.
    groups: Counter[Group] | None
    tail: list[Job]  # after an early stop, the only records whose reason may change
    holding: Iterable[Job] | None  # jobs holding resources, where kept
    factors: Mapping[int, Factors]
    # Remainders the pass stopped walking (their array reached its throttle): `ordered`
    # yields no more of their tasks.
    closed: set[int] = field(default_factory=set)
    index: PendingIndex | None = None  # the kept ranking, where the pass has it


class PassFactors(Mapping[int, Factors]):
    """The factors of the pass's eligible pending jobs, computed on demand with the
    pass's ranker (a job that changed since shows its new request at the pass's time)."""

    def __init__(self, state: ClusterState, rank: Ranker, now: float) -> None:
        self._state, self._rank, self._now = state, rank, now

    def __getitem__(self, job_id: int) -> Factors:
        found: Factors | None = self.get(job_id)
        if found is None:
            raise KeyError(job_id)
        return found

    def get(self, job_id: int, default: Any = None) -> Any:
        # Mapping's own `get` goes through a KeyError for each job without factors: in a
        # list of 10,000 held jobs (squeue's), most of the cost of the list.
        job = self._state.lookup(job_id)
        if job is None or job.state is not JobState.PENDING:
            return default
        if job.array_pending:
            job = task_of(job, job_id)
        if self._state.blocked_reason(job, self._now):
            return default
        return self._rank.factors(job)

    def _ids(self) -> list[int]:
        return [
            task.job_id
            for j in self._state.pending_jobs()
            for task in tasks_of(j)
            if not self._state.blocked_reason(task, self._now)
        ]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids())

    def __len__(self) -> int:
        return len(self._ids())


def plan(state: ClusterState, *, now: float, cmd_id: str) -> c.Allocate | None:
    return plan_pass(state, now=now, cmd_id=cmd_id).allocate


def full_queue(
    state: Any, now: float, weights: Weights | None, wait: Wait, skip: Skip | None = None
) -> Queue:
    """Every pending job asked and ranked from scratch, and walked to the end: the
    reference a kept ranking is tested against."""
    rank = ranker(state, now, weights)
    factors: dict[int, Factors] = {}
    queue: list[Ranked] = []
    shapes: dict[JobShape, int] = {}
    for job in state.pending_jobs():
        why = state.blocked_reason(job, now)
        if why:
            wait(job, why)
            continue
        f = rank.factors(job)
        holder = job.job_id if job.array_pending else None
        ids = startable(job)
        for k, task_id in enumerate(ids):
            factors[task_id] = f
            task = job if k == 0 else task_of(job, task_id)
            queue.append(((-f.priority, since(job), task_id), task, holder))
        shapes[job.shape] = shapes.get(job.shape, 0) + len(ids)
    queue.sort(key=itemgetter(0))  # keys are unique (job ids): jobs never compared
    return Queue(rank, iter(queue), shapes, None, [], None, factors)


def kept_queue(
    state: Any, now: float, weights: Weights | None, wait: Wait, skip: Skip | None = None
) -> Queue:
    """The ranking kept between passes (`ranking.py`): the blocked jobs are not in it;
    only those whose reason is not theirs yet are given it. The order is merged lazily
    from the classes, passing over the jobs `skip` says the pass has nothing to do for."""
    index = state.ranking(now)
    rank = ranker(state, now, weights, accounts=index.accounts)
    for job_id in index.misreasoned:
        wait(state.jobs[job_id], index.blocked[job_id])
    closed: set[int] = set()
    return Queue(
        rank,
        index.ranked(rank, state.jobs, closed, skip),
        dict(index.shapes),
        # Limits depend on what each job's user and account hold: every job is asked.
        None if state.policy.has_limits else Counter(index.groups),
        [state.jobs[i] for i in index.unsettled | index.special],
        index.holding.values(),
        PassFactors(state, rank, now),
        closed,
        index,
    )


Wait = Callable[[Job, str], None]
Skip = Callable[[Job], bool]
CHECK_EVERY = 64  # jobs walked between checks whether the rest of the queue is inert


def plan_pass(
    state: Any,
    *,
    now: float,
    cmd_id: str,
    weights: Weights | None = None,
    full: bool = False,
    check_every: int = CHECK_EVERY,
    estimate: bool = False,
) -> Plan:
    """One pass. `full`: rank every pending job from scratch and walk them all (the
    reference); else the kept ranking, stopping once the rest of the queue is inert
    (asked every `check_every` jobs walked). `estimate`: also reserve for the blocked
    jobs that no lower job made reservations for (the start estimates)."""
    depth = state.policy.backfill_depth
    reasons: list[tuple[int, str]] = []

    def wait(job: Job, reason: str) -> None:
        if job.reason != reason:
            reasons.append((job.job_id, reason))

    limited_by_policy = state.policy.has_limits
    failed: set[JobShape] = set()
    unreservable: set[JobShape] = set()  # failed shapes the timeline found no place for
    refused: dict[JobShape, float] = {}  # shape -> shortest end the timeline refused
    reservations: list[Reservation] = []
    waiting: set[str] = set()  # partitions with a blocked job already

    skipping = False  # set once the queue says whether preemption may read the blocked

    def dead(job: Job) -> bool:
        """Whether walking this job would do nothing: a plain job whose shape failed
        (what is free only shrinks in a pass), behind its partition's first blocked
        job and already waiting on Priority, past the last reservation the pass may
        make. What makes it so only grows during a pass, so the merge may pass over it
        as soon as it says so. Not where limits or preemption read every blocked job."""
        return (
            skipping
            and job.shape in failed
            and job.partition in waiting
            and job.reason == "Priority"
            and (len(reservations) >= depth or job.shape in unreservable)
            and not job.array_pending
            and not job.array_throttle
            and not job.spec.nodelist
        )

    queue = (full_queue if full else kept_queue)(state, now, weights, wait, dead)
    if not queue.shapes:
        # No task is eligible (the pass after a job ends, with none pending): nothing to
        # place, reserve or preempt for, only the blocked jobs' reasons. The free map
        # and the task mix, rebuilt after every change, would serve nothing.
        return Plan(_allocate(cmd_id, now, [], reasons), [], queue.factors, [], estimate)
    rank = queue.rank
    running_qos = queue.index.running_qos if queue.index is not None else None
    skipping = not limited_by_policy and not may_preempt(state.policy, running_qos)

    free = state.free_map()
    usage = Usage.of(state) if limited_by_policy else None
    timeline: Timeline | None = None
    # This pass's starts before it needed a timeline: the future is of the map before it.
    started: list[tuple[float, Allocs]] = []
    placements: list[c.Placement] = []
    blocked: list[Job] = []

    # Fragmentation is measured against what is waiting (FGD): the pending jobs' shapes.
    mix = task_mix(list(queue.shapes.items()))
    groups = queue.groups

    def placer(job: Job, where: FreeMap) -> Allocs | None:
        return place(state, job, where, mix=mix)

    def node_down(job: Job) -> bool:
        return bool(job.spec.nodelist) and any(
            name not in state.nodes or not state.nodes[name].takes_jobs
            for name in job.spec.nodelist
        )

    fits: set[JobShape] = set()  # shapes seen to fit (and be admitted) since the last change
    # Blocked jobs that may get a reservation, in order, not reserved yet: a reservation
    # only matters to a lower job that fits now (it must not delay it), so they are made
    # when one does, in this order. Nothing started since the first of them (a start
    # would have made them), so each is what it would have been when its job failed.
    deferred: list[Job] = []

    def reserve() -> None:
        nonlocal timeline
        for job in deferred:
            if len(reservations) >= depth or job.shape in unreservable:
                continue
            if timeline is None:
                kept = queue.index
                gone = kept.releases(now) if kept is not None else releases(state, now)
                timeline = Timeline(state.future(gone), gone, started)
            found = timeline.reserve(job, placer)
            if found is not None:
                reservations.append(found)
                fits.clear()
            else:  # the timeline only fills up: this shape finds no place again
                unreservable.add(job.shape)
        deferred.clear()

    def admits(allocs: Allocs, end: float) -> bool:
        if deferred:
            reserve()
        return timeline is None or timeline.admits(allocs, end)

    def inert() -> bool:
        """Whether walking the rest would change nothing but reasons: every shape left
        failed or was refused for jobs running as long (so nothing after would start,
        and no reservation of theirs could matter). A shape not met yet is tried now,
        once per shape: what is free only shrinks and the timeline only fills during a
        pass, so a shape that fails (or is refused) now fails (or is refused) when its
        first job comes, as it would have then."""
        assert groups is not None
        unknown: list[tuple[JobShape, float]] = []
        for (shape, limit), left in groups.items():
            if left <= 0 or shape in failed:
                continue
            end = now + limit * 60.0 if limit else math.inf
            if shape in refused and end >= refused[shape]:
                continue
            if shape in fits:
                return False
            unknown.append((shape, end))
        for shape, end in unknown:
            if shape in failed:  # tried for a group before, with another time limit
                continue
            if shape in refused and end >= refused[shape]:
                continue
            allocs = place_shape(state, shape, free, mix=mix)
            if allocs is None:
                failed.add(shape)
            elif not admits(allocs, end):
                refused[shape] = min(refused.get(shape, math.inf), end)
            else:
                fits.add(shape)
                return False
        return True

    closed = queue.closed
    progress: Counter[int] = Counter()  # tasks of each remainder walked
    waited: set[int] = set()  # remainders whose first task not started has its reason
    started_of: Counter[int] = Counter()  # tasks of each array this pass starts

    def wait_task(job: Job, holder: int | None, reason: str) -> None:
        """A remainder's reason is its first task's that does not start: the task that
        stands for the rest once the started ones left it."""
        if holder is None:
            wait(job, reason)
            return
        if holder in waited:
            return
        waited.add(holder)
        if state.jobs[holder].reason != reason:
            reasons.append((job.job_id, reason))

    def throttled(job: Job) -> bool:
        """The array's `%N` is reached, counting what this pass starts: the task waits
        (the next pass gives the array JobArrayTaskLimit)."""
        array = job.array_job_id
        return bool(
            job.array_throttle
            and array is not None
            and state.array_active.get(array, 0) + started_of[array] >= job.array_throttle
        )

    def close(holder: int) -> None:
        closed.add(holder)
        record = state.jobs[holder]
        left = len(startable(record)) - progress[holder]
        if groups is not None and left:
            groups[(record.shape, record.time_limit_min)] -= left

    walked = 0
    stopped: Ranked | None = None
    for item in queue.ordered:
        rank_at, job, holder = item
        if holder is not None and holder in closed:
            continue
        if groups is not None:
            if walked % check_every == 0 and walked and inert():
                stopped = item
                break
            groups[(job.shape, job.time_limit_min)] -= 1
            walked += 1
        if holder is not None:
            progress[holder] += 1
        # (Checks that concern few jobs first ask whether they concern this one.)
        if job.array_throttle and throttled(job):
            if holder is not None:
                close(holder)
            continue
        key = job.shape
        if job.spec.nodelist and node_down(job):
            wait_task(job, holder, "ReqNodeNotAvail")  # a node it insists on is down or drained
            continue
        limited = limit_reason(state, job, usage) if usage is not None else None
        if limited:
            wait_task(job, holder, limited)
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
            if admits(allocs, end):
                free.take_fitting(allocs)  # placed on `free` itself
                if timeline is not None:
                    timeline.hold(allocs, end, admitted=True)
                else:
                    started.append((end, allocs))
                if usage is not None:
                    usage.add(job)
                if job.array_job_id is not None:
                    started_of[job.array_job_id] += 1
                placements.append(c.Placement(job.job_id, allocs))
                refused.clear()  # what is free changed: another choice may be admitted
                fits.clear()
                continue
            # The same shape, running as long or longer, lands on the same resources
            # (placement is deterministic) and would be refused the same way.
            refused[key] = min(refused.get(key, math.inf), end)
        # It waits. As Slurm says it: the first blocked job of a partition waits on
        # Resources, the ones behind it on Priority (higher jobs exist). The top blocked
        # jobs also get reservations, which the jobs behind must not delay.
        blocked.append(job)
        if not fits_now and len(reservations) < depth and key not in unreservable:
            deferred.append(job)
        first = job.partition not in waiting
        if first:
            waiting.add(job.partition)
        reason = "Resources" if first else "Priority"
        if holder is not None:
            wait_task(job, holder, reason)
        elif job.reason != reason:
            reasons.append((job.job_id, reason))

    waiters: Iterable[Job] = blocked
    if stopped is not None:
        # The rest is inert: each task of it waits as it waits now. Only these can need
        # a new reason: the records whose reason is not "Priority" (or may change: a
        # node list), each remainder by its first task not walked; and the first task
        # of each partition that no blocked task reached yet (it waits on Resources).
        assert groups is not None
        cut = stopped[0]
        rest = chain([stopped], queue.ordered)
        looked: list[Ranked] = []
        items: dict[int, Ranked] = {}
        need = {shape.partition for (shape, _), left in groups.items() if left > 0} - waiting
        for item in rest if need else ():
            looked.append(item)
            _, job, holder = item
            if (holder is not None and holder in closed) or job.partition not in need:
                continue
            if node_down(job) or throttled(job):
                continue
            items[job.job_id] = item
            need.discard(job.partition)
            if not need:
                break
        for record in queue.tail:
            left = _first_left(rank, record, progress, closed | waited)
            if left is not None and left[0] >= cut:
                items.setdefault(left[1].job_id, left)
        for _, job, holder in sorted(items.values(), key=itemgetter(0)):
            if node_down(job):
                wait_task(job, holder, "ReqNodeNotAvail")
                continue
            if throttled(job):
                continue
            first = job.partition not in waiting
            waiting.add(job.partition)
            wait_task(job, holder, "Resources" if first else "Priority")
        # Preemption, where armed, still sees every blocked task, lazily.
        waiters = chain(
            blocked,
            (
                j
                for _, j, h in chain(looked, rest)
                if (h is None or h not in closed) and not node_down(j) and not throttled(j)
            ),
        )

    if estimate and deferred:
        # Nothing walked after them fits beside them: the reservations decide nothing
        # now, they only say when and where these jobs are expected to start.
        reserve()
    preempt = plan_preemption(
        state,
        waiters,
        free,
        rank,
        now=now,
        cmd_id=cmd_id,
        holding=queue.holding,
        running_qos=running_qos,
    )
    return Plan(
        _allocate(cmd_id, now, placements, reasons),
        preempt,
        queue.factors,
        reservations,
        estimated=estimate,
    )


def _allocate(
    cmd_id: str, now: float, placements: list[c.Placement], reasons: list[tuple[int, str]]
) -> c.Allocate | None:
    """The pass's command, if it changes anything."""
    if not placements and not reasons:
        return None
    reasons.sort()  # one order whichever way the pass went (job ids are unique)
    return c.Allocate(cmd_id=cmd_id, now=now, placements=tuple(placements), reasons=tuple(reasons))


def _first_left(
    rank: Ranker, record: Job, progress: Mapping[int, int], done: set[int]
) -> Ranked | None:
    """The record's first task that the pass did not walk, with its key: the record
    itself, or for a remainder the task after those the pass started (None when the
    pass closed it or gave it its reason already)."""
    key = rank_key(rank, record)
    if not record.array_pending:
        return key, record, None
    holder = record.job_id
    ids = startable(record)
    n = progress.get(holder, 0)
    if holder in done or n >= len(ids):
        return None
    task = record if n == 0 else task_of(record, ids[n])
    return (key[0], key[1], ids[n]), task, holder


__all__ = ["Plan", "plan", "plan_pass", "expected_end"]
