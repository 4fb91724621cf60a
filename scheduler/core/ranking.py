"""The ranking kept between passes: pending jobs in priority order without a sort.

A pass used to compute every pending job's priority and sort them all (50,000 jobs:
most of a second), then walk every one. `PendingIndex` keeps the pending jobs between
passes, so a pass pays for what changed and for the head of the queue it looks at.

Why the order can be kept although priority grows with age: a job's priority is
`w_age·age + (fair share, QoS, partition, size, nice)`, and everything but age is the
same for every job of one *class* (account, QoS, partition, GPU size, nice). Within a
class, priority never increases with the time a job became eligible (`since`): float
addition, division, `min`/`max` and `round` are all monotone. So each class is kept as
a list sorted by (since, job id) once, and stays sorted whatever `now` is and whatever
fair share does to the class's constants; a pass merges the class heads in a heap by
`(-priority now, since, job id)`, the ranking key (`rank_key`, which the full pass sorts
by too). Ties in the integer priority go to the job eligible first, then the lower id.
Fair-share, QoS, partition and cluster-size changes move whole classes, which the merge
re-reads every pass (one priority per class head, not per job).

What stays true between passes comes from `ClusterState`: every change of a job that
matters here (its state, its reason, a submit, an update, a hold, a purge) names the job
(`ClusterState.touch`), and the index re-reads the named jobs before the next pass. It
is derived state, like the free map: never pickled, rebuilt from the jobs when missing,
and a property test checks it against one built from scratch.

Jobs that *might* be blocked whatever the resources (held, with a dependency, a begin
time, an array throttle, or a node list that a down node breaks) are `special`: a pass
asks each of them every time. Every other pending job is eligible by construction.
`unsettled` holds the pending jobs whose reason is not "Priority": after a pass stops
early, only they (and the special ones) can need a new reason.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from scheduler.core.contract import HOLDS_RESOURCES, JobShape, JobState

if TYPE_CHECKING:
    from scheduler.core.jobs import Job
    from scheduler.core.priority import Ranker

ClassKey = tuple[str, str, str, int, int]  # account, QoS, partition, GPU milli, nice
RankKey = tuple[int, float, int]  # (-priority, since, job id): ascending is best first
Group = tuple[JobShape, "int | None"]  # shape and time limit: jobs a pass treats alike


def since(job: Job) -> float:
    """When the job became eligible: what its age counts from."""
    return job.eligible_time if job.eligible_time is not None else job.submit_time


def rank_key(rank: Ranker, job: Job) -> RankKey:
    return (-rank.factors(job).priority, since(job), job.job_id)


def class_of(job: Job) -> ClassKey:
    return (job.account, job.qos, job.partition, job.shape.resources.gpu_milli, job.spec.nice)


def is_special(job: Job) -> bool:
    """Whether the job may be blocked whatever the resources (`blocked_reason`), or wait
    on a node of its list: asked every pass."""
    return bool(
        job.hold
        or job.depends is not None
        or job.spec.begin_time is not None
        or job.array_throttle
        or job.spec.nodelist
    )


class Entry(NamedTuple):
    cls: ClassKey
    at: tuple[float, int]  # (since, job id): its place in its class
    group: Group
    special: bool


class PendingIndex:
    def __init__(self) -> None:
        self.classes: dict[ClassKey, list[tuple[float, int]]] = {}
        self.entries: dict[int, Entry] = {}  # every pending job
        self.special: set[int] = set()
        self.unsettled: set[int] = set()  # pending, reason not "Priority"
        # Pending jobs that are not special, counted by shape (the FGD task mix) and by
        # (shape, time limit) (when a pass may stop early).
        self.shapes: Counter[JobShape] = Counter()
        self.groups: Counter[Group] = Counter()
        self.holding: dict[int, Job] = {}  # jobs that hold resources (backfill, preemption)
        self.accounts: Counter[str] = Counter()  # accounts of every job in the state
        self._account_of: dict[int, str] = {}

    @classmethod
    def of(cls, jobs: Mapping[int, Job]) -> PendingIndex:
        index = cls()
        index.refresh(jobs, jobs)
        return index

    def refresh(self, jobs: Mapping[int, Job], job_ids: Iterable[int]) -> None:
        """Re-read these jobs (gone ones are forgotten)."""
        for job_id in job_ids:
            self._refresh(jobs.get(job_id), job_id)

    def _refresh(self, job: Job | None, job_id: int) -> None:
        if job is None:
            account = self._account_of.pop(job_id, None)
            if account is not None:
                self.accounts[account] -= 1
                if not self.accounts[account]:
                    del self.accounts[account]
        elif job_id not in self._account_of:
            self._account_of[job_id] = job.account
            self.accounts[job.account] += 1
        entry = None
        if job is not None and job.state is JobState.PENDING:
            entry = Entry(
                class_of(job),
                (since(job), job_id),
                (job.shape, job.time_limit_min),
                is_special(job),
            )
        old = self.entries.get(job_id)
        if old is not None and old != entry:  # it left, or moved: out of its place
            del self.entries[job_id]
            members = self.classes[old.cls]
            del members[_find(members, old.at)]
            if not members:
                del self.classes[old.cls]
            if old.special:
                self.special.discard(job_id)
            else:
                _drop(self.shapes, old.group[0])
                _drop(self.groups, old.group)
        if entry is not None and old != entry:  # it came, or moved: into its place
            self.entries[job_id] = entry
            _insort(self.classes.setdefault(entry.cls, []), entry.at)
            if entry.special:
                self.special.add(job_id)
            else:
                self.shapes[entry.group[0]] += 1
                self.groups[entry.group] += 1
        # Most touches only set a reason: the job keeps its place.
        if job is not None and entry is not None and job.reason != "Priority":
            self.unsettled.add(job_id)
        else:
            self.unsettled.discard(job_id)
        if job is not None and job.state in HOLDS_RESOURCES:
            self.holding[job_id] = job
        else:
            self.holding.pop(job_id, None)

    def ranked(self, rank: Ranker, jobs: Mapping[int, Job]) -> Iterator[tuple[RankKey, Job]]:
        """Every pending job, best first, lazily: a k-way merge of the classes, one heap
        step per job the pass looks at. The index must not change while this runs (a
        pass is pure)."""
        lists = list(self.classes.values())
        heap: list[tuple[int, float, int, int, int]] = []
        for i, members in enumerate(lists):
            at, job_id = members[0]
            heap.append((-rank.factors(jobs[job_id]).priority, at, job_id, i, 0))
        heapq.heapify(heap)
        while heap:
            negative, at, job_id, i, pos = heap[0]
            job = jobs[job_id]
            pos += 1
            members = lists[i]
            if pos < len(members):
                nat, nid = members[pos]
                heapq.heapreplace(heap, (-rank.factors(jobs[nid]).priority, nat, nid, i, pos))
            else:
                heapq.heappop(heap)
            yield (negative, at, job_id), job


def _find(members: list[tuple[float, int]], at: tuple[float, int]) -> int:
    i = bisect_left(members, at)
    if i == len(members) or members[i] != at:
        raise AssertionError(f"ranking lost {at!r}")
    return i


def _insort(members: list[tuple[float, int]], at: tuple[float, int]) -> None:
    # Most submissions are the newest of their class: an append.
    if not members or members[-1] < at:
        members.append(at)
    else:
        insort(members, at)


K = TypeVar("K")


def _drop(counter: Counter[K], key: K) -> None:
    counter[key] -= 1
    if not counter[key]:
        del counter[key]
