"""Backfill: reservations for the top blocked jobs, and the rule that guards them.

The future is a `Timeline` of *shadows*: copies of what is free now, with the running
jobs given back in the order their time limits end, taken at a few probe points
(after geometrically more releases, from 1 to all; one day ahead at most, Slurm's
`bf_window`). A blocked job is reserved at the first probe where it fits, and its
allocation is taken from that shadow and every later one. A lower job may start now
only if it also fits in every shadow, from the first reservation on, that it would
still be running at: then no reserved job starts later than its reservation because of
it (the property tests check this against `earliest_start`, an exact search).

Probe points make a reservation's time an upper bound (the job may really fit a few
releases earlier), which is the safe side: it only ever admits fewer backfill jobs.
A probe takes every release at its time (jobs started together end together). Building
the shadows (`Future`) costs one copy of the free map per probe (copy on write) and one
give per release; the state keeps them while what the nodes hold stays, and a pass
copies a shadow only where it starts or reserves something in it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.core.contract import HOLDS_RESOURCES
from scheduler.core.freemap import FreeMap
from scheduler.core.jobs import Job, NodeAlloc

if TYPE_CHECKING:
    from scheduler.core.state import ClusterState

Allocs = tuple[tuple[str, NodeAlloc], ...]
Place = Callable[[Job, FreeMap], Allocs | None]

WINDOW_S = 24 * 3600.0  # how far ahead reservations are planned (Slurm's bf_window)
MAX_RELEASES = 2048  # releases considered per pass: bounds the cost at 4,096 nodes


def expected_end(job: Job, now: float) -> float:
    """When a job will have ended at the latest: start plus its time limit (plus the time
    it spent suspended). A suspended job holds what it has until someone resumes it."""
    deadline = job.run_deadline()
    return math.inf if deadline is None else max(now, deadline)


def releases(
    state: ClusterState, now: float, holding: Iterable[Job] | None = None
) -> list[tuple[float, Allocs]]:
    """Running jobs that end within the window, soonest first (then by job id).
    `holding`: the jobs that hold resources, where the caller keeps them."""
    found = []
    jobs = holding if holding is not None else state.jobs.values()
    for job in jobs:
        if job.state in HOLDS_RESOURCES:
            end = expected_end(job, now)
            if end <= now + WINDOW_S:
                found.append((end, job.job_id, job))
    found.sort(key=lambda r: r[:2])
    return [(end, tuple(job.allocation.items())) for end, _, job in found[:MAX_RELEASES]]


@dataclass(frozen=True)
class Reservation:
    """Resources held for a blocked job from `start` on: when the pass expects it to
    start, and where (Slurm's StartTime and SchedNodes of a pending job)."""

    job_id: int
    start: float
    allocs: Allocs

    @property
    def nodes(self) -> list[str]:
        """Its nodes in name order, as Slurm lists SchedNodes (node table order)."""
        return sorted(name for name, _ in self.allocs)


MAX_PROBES = 8


def probe_counts(n: int, probes: int = MAX_PROBES) -> list[int]:
    """Release counts to probe at: geometric from 1 to n (1, 3, 8, 23, ... n), at most
    `probes` of them. Each probe costs a copy of the free map."""
    if n <= 0:
        return []
    if probes < 2 or n == 1:
        return [n]
    return sorted({max(1, round(n ** (i / (probes - 1)))) for i in range(probes)} | {n})


def probe_points(times: Sequence[float], probes: int = MAX_PROBES) -> list[int]:
    """`probe_counts` over releases at these times (ascending), each count taken on to
    the last release at its time: a probe at time t holds everything released by t
    (what is really free then), and releases at one time (the jobs a pass started
    together, those past their limit) make one probe, not several of the same time."""
    out: list[int] = []
    for k in probe_counts(len(times), probes):
        k = bisect_right(times, times[k - 1])
        if not out or out[-1] != k:
            out.append(k)
    return out


class Future:
    """The shadows of the future for one free map and one sequence of releases, as no
    pass changed them (no start, no reservation): what a pass's `Timeline` reads, and
    copies a shadow of only where it takes something from it. They depend on what the
    nodes hold and on the releases alone, so the state keeps them between passes
    (`ClusterState.future`) until a command changes what nodes hold or a release moves:
    a burst of submissions plans on one future instead of giving back every running
    job again per pass. Built lazily, each shadow from the one before: a pass whose
    reservations all fit early never gives back the far future."""

    def __init__(self, free: FreeMap, ends: Sequence[tuple[float, Allocs]]) -> None:
        self.free = free
        self.allocs = tuple(allocs for _, allocs in ends)
        self.counts = probe_points([end for end, _ in ends])
        self._shadow = free.copy()
        self._given = 0
        self.shadows: list[FreeMap] = []

    def matches(self, free: FreeMap, ends: Sequence[tuple[float, Allocs]]) -> bool:
        """Whether these are the shadows of `free` and `ends` (the releases' times only
        decide where the probes are)."""
        return (
            free is self.free
            and tuple(allocs for _, allocs in ends) == self.allocs
            and probe_points([end for end, _ in ends]) == self.counts
        )

    def shadow(self, i: int) -> FreeMap | None:
        """The i-th probe's shadow (never to be changed: copy it first), None past the last."""
        while len(self.shadows) <= i:
            if len(self.shadows) == len(self.counts):
                return None
            k = self.counts[len(self.shadows)]
            while self._given < k:
                self._shadow.give(self.allocs[self._given])
                self._given += 1
            # The last probe is the shadow itself: nothing is given back after it.
            last = len(self.shadows) + 1 == len(self.counts)
            self.shadows.append(self._shadow if last else self._shadow.copy())
        return self.shadows[i]


class Timeline:
    """One pass's view of the future: the `Future`'s shadows less what the pass started
    (until those jobs end) and reserved (from the reservation on)."""

    def __init__(
        self,
        future: Future,
        ends: Sequence[tuple[float, Allocs]],
        started: Iterable[tuple[float, Allocs]] = (),
    ) -> None:
        # `started`: (end, allocs) of the jobs the pass started before it needed the
        # timeline (the future is of the map before the pass).
        self._future = future
        self._ends = ends
        self._counts = future.counts
        self.points: list[tuple[float, FreeMap]] = []
        self._mine: set[int] = set()  # probes copied from the future's, to change
        self._held: list[tuple[Allocs, float]] = [(a, end) for end, a in started]
        self.first_reserved = len(self._counts)  # index of the earliest reservation's probe
        # Per job shape, the first probe it may fit at: shadows only fill up in a pass, so
        # a shape that did not fit a probe never fits it again (`place` fails by shape).
        self._from: dict[Hashable, int] = {}

    def _point(self, i: int) -> tuple[float, FreeMap] | None:
        while len(self.points) <= i:
            j = len(self.points)
            shadow = self._future.shadow(j)
            if shadow is None:
                return None
            at = self._ends[self._counts[j] - 1][0]
            self.points.append((at, shadow))
            for allocs, end in self._held:  # jobs started now still running then
                if at < end and self.points[j][1].can_take(allocs):
                    self._take(j, allocs)
        return self.points[i]

    def _take(self, i: int, allocs: Allocs) -> None:
        at, shadow = self.points[i]
        if i not in self._mine:
            shadow = shadow.copy()
            self.points[i] = (at, shadow)
            self._mine.add(i)
        shadow.take_fitting(allocs)

    def reserve(self, job: Job, place: Place) -> Reservation | None:
        i = self._from.get(job.shape, 0)
        while (point := self._point(i)) is not None:
            at, shadow = point
            allocs = place(job, shadow)
            if allocs is not None:
                self._from[job.shape] = i
                self._held.append((allocs, math.inf))  # reserved from `at` on: every later probe
                self._take(i, allocs)  # placed on that shadow: it fits
                for j in range(i + 1, len(self.points)):
                    if self.points[j][1].can_take(allocs):
                        self._take(j, allocs)
                self.first_reserved = min(self.first_reserved, i)
                return Reservation(job.job_id, at, allocs)
            i += 1
        self._from[job.shape] = i
        return None

    def admits(self, allocs: Allocs, end: float) -> bool:
        return all(
            shadow.can_take(allocs) for at, shadow in self.points[self.first_reserved :] if at < end
        )

    def hold(self, allocs: Allocs, end: float, *, admitted: bool = False) -> None:
        """A job started now runs until `end`: take it from the shadows it overlaps.
        `admitted`: `admits` just said yes, so it fits the shadows that it checked."""
        self._held.append((allocs, end))
        for i, (at, shadow) in enumerate(self.points):
            if at >= end:
                break
            if (admitted and i >= self.first_reserved) or shadow.can_take(allocs):
                self._take(i, allocs)


def earliest_start(
    job: Job, free: FreeMap, ends: Sequence[tuple[float, Allocs]], place: Place, now: float
) -> float | None:
    """The exact earliest time `job` fits, by binary search over the releases (fitting
    only gets easier as more is given back). The reference the timeline is tested against."""

    def fits(k: int) -> bool:
        shadow = free.copy()
        for _, allocs in ends[:k]:
            shadow.give(allocs)
        return place(job, shadow) is not None

    if not fits(len(ends)):
        return None
    lo, hi = -1, len(ends)  # fits(hi) is true; fits(lo) is false (lo = -1: nothing)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return now if hi == 0 else ends[hi - 1][0]
