"""The ranking kept between passes: the eligible pending jobs in priority order without a
sort, and the blocked ones out of the way until they may start.

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

An array's pending remainder (arrays.py) is one entry standing for its tasks: the merge
yields them one by one (all have the remainder's priority, and their job ids follow each
other), so a pass sees each task where a job of its own would stand.

Blocked jobs (held, waiting on a dependency, a begin time or the array throttle:
`blocked_reason`) are not in the classes at all, so a pass never looks at them. A job
leaves that set only through a command or the time: every change of a job that matters
names the job (`ClusterState.touch`), the index re-reads the named jobs before the next
pass, and a re-read job names the jobs that wait on it in turn (`dependents`: those
whose dependency names it or its array, the singletons of its user and name, the other
pending tasks of a throttled array). A begin time, or an `after:N+min` delay, runs out
with the pass's `now`: such jobs wait in a heap by that time (`wakes`). A blocked job
whose recorded reason is not its reason yet (`misreasoned`) is given it by the next
pass, and again until the state says so.

It is derived state, like the free map: never pickled, rebuilt from the jobs when
missing (or when a pass comes with an earlier `now` than the last), and a property test
checks it against one built from scratch. `unsettled` holds the eligible jobs whose
reason is not "Priority": after a pass stops early, only they (and the jobs with a node
list, `special`) can need a new reason.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from scheduler.core.arrays import task_of
from scheduler.core.backfill import MAX_RELEASES, WINDOW_S, Allocs
from scheduler.core.contract import HOLDS_RESOURCES, JobShape, JobState

if TYPE_CHECKING:
    from scheduler.core.jobs import Job
    from scheduler.core.priority import Ranker

SKIP_RUN = 16  # members of a class passed over per step of the merge, at most
ClassKey = tuple[str, str, str, int, int]  # account, QoS, partition, GPU milli, nice
RankKey = tuple[int, float, int]  # (-priority, since, job id): ascending is best first
Group = tuple[JobShape, "int | None"]  # shape and time limit: jobs a pass treats alike
# A task in rank order: its key, the task, and the record of the remainder it is a task
# of (None: a job of its own).
Ranked = tuple[RankKey, "Job", "int | None"]


def since(job: Job) -> float:
    """When the job became eligible: what its age counts from."""
    return job.eligible_time if job.eligible_time is not None else job.submit_time


def rank_key(rank: Ranker, job: Job) -> RankKey:
    return (-rank.factors(job).priority, since(job), job.job_id)


def class_of(job: Job) -> ClassKey:
    return (job.account, job.qos, job.partition, job.shape.resources.gpu_milli, job.spec.nice)


def singleton(job: Job) -> bool:
    return job.depends is not None and any(t.kind == "singleton" for t in job.depends.terms)


def startable(job: Job) -> tuple[int, ...]:
    """The job ids of the tasks a pass may start of this eligible record, in order: the
    job, or each task of a remainder; only its first for a singleton (the others wait on
    it, which is active)."""
    if not job.array_pending or singleton(job):
        return (job.job_id,)
    return (job.job_id, *job.array_pending)


def is_special(job: Job) -> bool:
    """Whether an eligible job may still wait on something else than resources and
    priority whatever its place: a node of its list that is down (ReqNodeNotAvail)."""
    return bool(job.spec.nodelist)


class Entry(NamedTuple):
    cls: ClassKey
    at: tuple[float, int]  # (since, job id): its place in its class
    group: Group
    tasks: int  # tasks a pass may start of it (`startable`)
    special: bool


# What a job was when last read, for the jobs that wait on it: its state, when it
# started, its user and name (singletons), its array.
Seen = tuple[JobState, "float | None", str, str, "int | None"]
Link = tuple[dict[Any, set[int]], Any]  # a table of waiters, and this job's key in it


class State(Protocol):
    """What the index reads of the state (`ClusterState`)."""

    @property
    def jobs(self) -> Mapping[int, Job]: ...

    def blocked_reason(self, job: Job, now: float) -> str | None: ...
    def wake_time(self, job: Job, now: float) -> float | None: ...


class PendingIndex:
    def __init__(self) -> None:
        self.classes: dict[ClassKey, list[tuple[float, int]]] = {}
        self.entries: dict[int, Entry] = {}  # every eligible pending record
        self.special: set[int] = set()  # eligible, with a node list
        self.unsettled: set[int] = set()  # eligible, reason not "Priority"
        # Eligible tasks counted by shape (the FGD task mix) and by (shape, time limit)
        # (when a pass may stop early).
        self.shapes: Counter[JobShape] = Counter()
        self.groups: Counter[Group] = Counter()
        self.holding: dict[int, Job] = {}  # jobs that hold resources (backfill, preemption)
        # Of those: (time limit's end, job id) in order, and what each holds (backfill's
        # releases without a sort per pass); how many run per QoS (preemption).
        self.deadlines: list[tuple[float, int]] = []
        self._deadline: dict[int, tuple[float, Allocs]] = {}
        self.running_qos: Counter[str] = Counter()
        self._qos_of: dict[int, str] = {}
        self.accounts: Counter[str] = Counter()  # accounts of every job in the state
        self._account_of: dict[int, str] = {}
        # The blocked pending records and why, those whose recorded reason differs, and
        # (time, job id) of those whose reason may change with time alone.
        self.blocked: dict[int, str] = {}
        self.misreasoned: set[int] = set()
        self.wakes: list[tuple[float, int]] = []
        self._wake_at: dict[int, float] = {}  # each job's latest entry in `wakes`
        # Pending records by what they wait on: a job or array id their dependency names,
        # (user, name) of a singleton, the array of a throttled task.
        self.dependents: dict[int, set[int]] = {}
        self.singletons: dict[tuple[str, str], set[int]] = {}
        self.throttled: dict[int, set[int]] = {}
        self._links: dict[int, list[Link]] = {}
        self._seen: dict[int, Seen] = {}
        self.now = -float("inf")  # the latest pass time read at

    @classmethod
    def of(cls, state: State, now: float) -> PendingIndex:
        index = cls()
        index.refresh(state, state.jobs, now)
        return index

    def refresh(self, state: State, job_ids: Iterable[int], now: float) -> None:
        """Re-read these jobs as of `now` (gone ones are forgotten), the jobs whose begin
        time or delay ran out by then, and the jobs that wait on any of them."""
        self.now = max(self.now, now)
        todo = list(job_ids)
        while self.wakes and self.wakes[0][0] <= now:
            at, job_id = heapq.heappop(self.wakes)
            if self._wake_at.get(job_id) == at:
                del self._wake_at[job_id]
            todo.append(job_id)
        done: set[int] = set()
        for job_id in todo:  # grows as re-read jobs name those that wait on them
            if job_id not in done:
                done.add(job_id)
                todo.extend(self._refresh(state, state.jobs.get(job_id), job_id, now))

    def _refresh(self, state: State, job: Job | None, job_id: int, now: float) -> list[int]:
        waiters = self._note(job, job_id)
        pending = job is not None and job.state is JobState.PENDING
        why = state.blocked_reason(job, now) if job is not None and pending else None
        entry = None
        if job is not None and pending and why is None:
            entry = Entry(
                class_of(job),
                (since(job), job_id),
                (job.shape, job.time_limit_min),
                len(startable(job)),
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
            _drop(self.shapes, old.group[0], old.tasks)
            _drop(self.groups, old.group, old.tasks)
        if entry is not None and old != entry:  # it came, or moved: into its place
            self.entries[job_id] = entry
            _insort(self.classes.setdefault(entry.cls, []), entry.at)
            if entry.special:
                self.special.add(job_id)
            self.shapes[entry.group[0]] += entry.tasks
            self.groups[entry.group] += entry.tasks
        # Most touches only set a reason: the job keeps its place.
        if job is not None and entry is not None and job.reason != "Priority":
            self.unsettled.add(job_id)
        else:
            self.unsettled.discard(job_id)
        if job is not None and why is not None:
            self.blocked[job_id] = why
            if job.reason != why:
                self.misreasoned.add(job_id)
            else:
                self.misreasoned.discard(job_id)
            wake = state.wake_time(job, now)
            if wake is not None and self._wake_at.get(job_id) != wake:
                self._wake_at[job_id] = wake
                heapq.heappush(self.wakes, (wake, job_id))
        else:
            self.blocked.pop(job_id, None)
            self.misreasoned.discard(job_id)
        self._link(job if pending else None, job_id)
        self._hold(job, job_id)
        return waiters

    def _hold(self, job: Job | None, job_id: int) -> None:
        holds = job is not None and job.state in HOLDS_RESOURCES
        if job is not None and holds:
            self.holding[job_id] = job
        else:
            self.holding.pop(job_id, None)
        deadline = job.run_deadline() if job is not None and holds else None
        old = self._deadline.pop(job_id, None)
        if old is not None:
            del self.deadlines[bisect_left(self.deadlines, (old[0], job_id))]
        if job is not None and deadline is not None:
            self._deadline[job_id] = (deadline, tuple(job.allocation.items()))
            insort(self.deadlines, (deadline, job_id))
        qos = self._qos_of.pop(job_id, None)
        if qos is not None:
            _drop(self.running_qos, qos)
        if job is not None and job.state is JobState.RUNNING:
            self._qos_of[job_id] = job.qos
            self.running_qos[job.qos] += 1

    def releases(self, now: float) -> list[tuple[float, Allocs]]:
        """`backfill.releases` from the kept deadlines: the jobs past theirs end now (in
        job id order), then the others in the order theirs come, within the window."""
        cut = bisect_right(self.deadlines, (now, math.inf))
        overdue = sorted(job_id for _, job_id in self.deadlines[:cut])[:MAX_RELEASES]
        out = [(now, self._deadline[job_id][1]) for job_id in overdue]
        limit = now + WINDOW_S
        for deadline, job_id in islice(self.deadlines, cut, cut + MAX_RELEASES - len(out)):
            if deadline > limit:
                break
            out.append((deadline, self._deadline[job_id][1]))
        return out

    def _note(self, job: Job | None, job_id: int) -> list[int]:
        """Keep what the job is for those that wait on it; the ones to re-read if that
        changed."""
        if job is None:
            account = self._account_of.pop(job_id, None)
            if account is not None:
                self.accounts[account] -= 1
                if not self.accounts[account]:
                    del self.accounts[account]
        elif job_id not in self._account_of:
            self._account_of[job_id] = job.account
            self.accounts[job.account] += 1
        old = self._seen.get(job_id)
        new: Seen | None = None
        if job is not None:
            new = (job.state, job.start_time, job.spec.user, job.spec.name, job.array_job_id)
        if old == new:
            return []
        if new is None:
            del self._seen[job_id]
        else:
            self._seen[job_id] = new
        waiters: set[int] = set(self.dependents.get(job_id, ()))
        holds = [s is not None and s[0] in HOLDS_RESOURCES for s in (old, new)]
        active = [s is not None and s[0].is_active for s in (old, new)]
        for seen in (old, new):
            if seen is None:
                continue
            _, _, user, name, array = seen
            # A singleton waits while an earlier job of its user and name is active.
            if active[0] != active[1] or (old and new and old[2:4] != new[2:4]):
                waiters.update(self.singletons.get((user, name), ()))
            if array is not None:
                waiters.update(self.dependents.get(array, ()))
                if holds[0] != holds[1]:  # what the array's `%N` counts changed
                    waiters.update(self.throttled.get(array, ()))
        waiters.discard(job_id)
        return sorted(waiters)

    def _link(self, job: Job | None, job_id: int) -> None:
        """File a pending record under what it waits on (or take it out)."""
        for table, key in self._links.pop(job_id, ()):
            waiting = table[key]
            waiting.discard(job_id)
            if not waiting:
                del table[key]
        if job is None:
            return
        links: list[Link] = []
        for term in job.depends.terms if job.depends is not None else ():
            if term.kind == "singleton":
                links.append((self.singletons, (job.spec.user, job.spec.name)))
            else:
                links.append((self.dependents, term.job_id))
        if job.array_throttle and job.array_job_id is not None:
            links.append((self.throttled, job.array_job_id))
        links = list({(id(t), k): (t, k) for t, k in links}.values())  # `1?afternotok:1`
        for table, key in links:
            table.setdefault(key, set()).add(job_id)
        if links:
            self._links[job_id] = links

    def ranked(
        self,
        rank: Ranker,
        jobs: Mapping[int, Job],
        closed: set[int],
        skip: Callable[[Job], bool] | None = None,
    ) -> Iterator[Ranked]:
        """Every eligible pending task, best first, lazily: a k-way merge of the classes,
        one heap step per task the pass looks at (a remainder's tasks one after the
        other, until the pass closes it: `closed`). The index must not change while
        this runs (a pass is pure). `skip`: jobs the pass has nothing to do for, and will
        not have when they would come (the pass's own rule, `planner`): a class's run of
        them is passed over without a heap step or a priority each."""
        lists = list(self.classes.values())
        # A class's factors but age, once per pass: its members' priorities follow from
        # the time each became eligible (the `since` it is kept by).
        constants = [rank.constants(jobs[members[0][1]]) for members in lists]
        heap: list[tuple[int, float, int, int, int, int]] = []
        for i, members in enumerate(lists):
            at, job_id = members[0]
            heap.append((-rank.priority(constants[i], at), at, job_id, i, 0, 0))
        heapq.heapify(heap)
        priority, replace, pop = rank.priority, heapq.heapreplace, heapq.heappop
        while heap:
            negative, at, task_id, i, pos, k = heap[0]
            members = lists[i]
            record = jobs[members[pos][1]]
            nxt = pos + 1
            if k == 0 and skip is not None:
                # A few at a time: the pass may stop (inert) long before the class ends.
                end = min(len(members), nxt + SKIP_RUN)
                while nxt < end and skip(jobs[members[nxt][1]]):
                    nxt += 1
            if k == 0 and nxt < len(members):
                nat, nid = members[nxt]
                replace(heap, (-priority(constants[i], nat), nat, nid, i, nxt, 0))
            else:
                pop(heap)
            holder = record.job_id if record.array_pending else None
            if holder is None:
                yield (negative, at, task_id), record, None
                continue
            if holder in closed:
                continue
            # The next task of the remainder: the same priority and since, the next id.
            if k < len(record.array_pending) and not singleton(record):
                heapq.heappush(heap, (negative, at, record.array_pending[k], i, pos, k + 1))
            task = record if k == 0 else task_of(record, task_id)
            yield (negative, at, task_id), task, holder


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


def _drop(counter: Counter[K], key: K, count: int = 1) -> None:
    counter[key] -= count
    if not counter[key]:
        del counter[key]
