"""What the controller answers about jobs: the job dicts and the columns answer of a list
(squeue's, the web's live queue), a pending job's priority as the last pass ranked it,
and when and where it is expected to start, as the last estimate reserved it.

Every read takes the replica's lock (the Raft thread applies under it), so the API runs
them in its thread pool. A list of 10,000 jobs is built a field at a time from the jobs
themselves (`VIEW`'s getters), with no job dict per job.

Tools poll the queue (`squeue` in a loop, workflow managers every few seconds, the
portal's live table), mostly while nothing changed. Slurm answers such a poll with
SLURM_NO_CHANGE_IN_DATA when the caller says when it last read; here the controller
itself keeps the last columns answers of the state as it is (`ColumnsMemo`), keyed by
what they were asked for, and drops them all when anything is applied: every change of
the state is a command the replica applies under its lock (`Replica.version` counts
them, snapshots included), so an answer of an older version is never served. The
priority column is the last pass's ranking (a pass a second at least: the age factor
grows), kept for that pass only. Nor is an answer whose fields describe the state as
of now (`dependency`, read through the job dict).

The factors and the start estimates (the job object's `priority`, `priority_factors`,
`expected_start`, `sched_nodes`) are a projection of the leader's planning, kept beside
the replicated state, never in it: replicas apply commands deterministically and never
plan, and an estimate is no fact of the log (it moves with time and with every start
and end). `VIEW` gives what a job says by itself (no estimate; its begin time while it
waits for that); the reads fill in the last pass's view for pending jobs. A follower, or
a leader before its first pass, has none, and a replica that stops leading forgets its
estimates. Estimates cost a pass a backfill timeline that it may not need for its own
decisions (`plan_pass(estimate=True)`), so a pass makes them at most every
`START_ESTIMATE_INTERVAL_S` (`estimate_due`), as Slurm's backfill sets its start times
every `bf_interval`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

from scheduler.core.backfill import Reservation
from scheduler.core.contract import ACTIVE, JobState
from scheduler.core.contract.job_object import columns_answer
from scheduler.core.contract.runs import encode_column
from scheduler.core.jobs import VIEW, Job
from scheduler.core.priority import Factors
from scheduler.core.state import ClusterState

if TYPE_CHECKING:
    from scheduler.core.planner import Plan
    from scheduler.ctld.replica import Replica

# Answers kept per state version: a few tenants' squeue, each with its own filters.
MEMO_ANSWERS = 16
START_ESTIMATE_INTERVAL_S = 5.0  # a pass estimates starts at most this often
# The job object's fields that the last estimate's reservation of a pending job gives
# (the contract's names), and how.
RESERVED: dict[str, Callable[[Reservation], Any]] = {
    "expected_start": attrgetter("start"),
    "sched_nodes": attrgetter("nodes"),
}
# The fields a read takes from the leader's last passes, not from the state alone.
_OF_PASSES = frozenset({"priority", *RESERVED})
# The filters a list takes, by getter (a job matches a list of values if its own is one).
_BY_VALUE = (
    attrgetter("spec.user"),
    attrgetter("spec.name"),
    attrgetter("account"),
    attrgetter("partition"),
)


class Built:
    """One memo entry: the jobs chosen, in job id order, their columns but the passes'
    (`_OF_PASSES`), their priority column as of one pass (`of_pass`, the pass's factors)
    and their estimate columns as of one estimate (`of_estimate`, its reservations)."""

    __slots__ = ("chosen", "columns", "estimated", "of_estimate", "of_pass", "priority", "runs")

    def __init__(self, chosen: list[Job], columns: dict[str, list[Any]]) -> None:
        self.chosen = chosen
        self.columns = columns
        self.runs: dict[str, Any] = {}  # `columns`' own, each in runs as asked (`runs.py`)
        self.of_pass: Mapping[int, Factors] | None = None
        self.priority: list[int] = []
        self.of_estimate: Mapping[int, Reservation] | None = None
        self.estimated: dict[str, list[Any]] = {}


class ColumnsMemo:
    """The columns answers built for one version of the state (`Replica.version`), by
    their query; all forgotten when the version moves. Used under the replica's lock."""

    def __init__(self, size: int = MEMO_ANSWERS) -> None:
        self._size = size
        self._version = -1
        self._answers: OrderedDict[tuple[Any, ...], Built] = OrderedDict()

    def get(self, version: int, key: tuple[Any, ...]) -> Built | None:
        if version != self._version:
            self._answers.clear()
            self._version = version
            return None
        found = self._answers.get(key)
        if found is not None:
            self._answers.move_to_end(key)
        return found

    def put(self, version: int, key: tuple[Any, ...], built: Built) -> None:
        if version != self._version:
            self._answers.clear()
            self._version = version
        self._answers[key] = built
        while len(self._answers) > self._size:
            self._answers.popitem(last=False)


class JobReads:
    """The job reads of one replica (`attach`ed once it exists: the replica's apply
    builds a submitted job's view with `job_view`)."""

    def __init__(self, *, estimate_every_s: float = START_ESTIMATE_INTERVAL_S) -> None:
        self._replica: Replica | None = None
        # The last pass's factors, computed per job when asked (a pass ranks 50,000 jobs
        # without building them); leader-local, read under the replica's lock like the
        # state: what sprio and squeue's priority show.
        self.priorities: Mapping[int, Factors] = {}
        # The last estimating pass's reservations by job id (at most backfill_depth):
        # what squeue --start shows. Leader-local, like the factors.
        self.reservations: Mapping[int, Reservation] = {}
        self._estimate_every_s = estimate_every_s
        self._next_estimate = 0.0  # monotonic
        self._memo = ColumnsMemo()

    def attach(self, replica: Replica) -> None:
        self._replica = replica

    @property
    def replica(self) -> Replica:
        assert self._replica is not None, "JobReads used before its replica exists"
        return self._replica

    def estimate_due(self) -> bool:
        """Whether the next pass is to estimate starts (then the one after waits its
        turn): at most every `START_ESTIMATE_INTERVAL_S`, at once after `forget`."""
        now = time.monotonic()
        if now < self._next_estimate:
            return False
        self._next_estimate = now + self._estimate_every_s
        return True

    def keep(self, plan: Plan) -> None:
        """What a pass says of the pending jobs, for the reads: its factors, and its
        reservations where it estimated them all (a pass that did not keeps the last)."""
        self.priorities = plan.factors
        if plan.estimated:
            self.reservations = {r.job_id: r for r in plan.reservations}

    def forget(self) -> None:
        """This replica no longer leads: another plans, and its estimates would only grow
        stale; it estimates on its first pass if it leads again."""
        self.reservations = {}
        self._next_estimate = 0.0

    def jobs(
        self,
        *,
        tenant: str | None = None,
        states: set[str] | None = None,
        ids: set[int] | None = None,
        users: Iterable[str] = (),
        names: Iterable[str] = (),
        accounts: Iterable[str] = (),
        partitions: Iterable[str] = (),
        ended_after: float | None = None,
        fields: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """The jobs that match every filter given, in job id order, as job dicts, cut to
        `fields` (the contract's names, from `contract.select_fields`) where given. An id
        names a job, or every task of the array job it is (squeue -j); a list of names
        matches any of them; `ended_after` keeps a job that ended only if it ended then
        or later (squeue's window on ended jobs)."""
        now = time.time()
        with self.replica.lock:
            state = self.replica.state
            out = [
                self._with_pass(job, state.job_dict(job, now, fields=fields), fields)
                for job in matching(
                    state, tenant, states, ids, users, names, accounts, partitions, ended_after
                )
            ]
        out.sort(key=itemgetter("job_id"))
        return out

    def job_columns(
        self,
        *,
        fields: Sequence[str],
        tenant: str | None = None,
        states: set[str] | None = None,
        ids: set[int] | None = None,
        users: Iterable[str] = (),
        names: Iterable[str] = (),
        accounts: Iterable[str] = (),
        partitions: Iterable[str] = (),
        ended_after: float | None = None,
        runs: bool = False,
    ) -> dict[str, Any]:
        """The same jobs (`jobs`) as the columns answer (`contract.job_object`), in runs
        where `runs` (`shape=runs`: `contract.runs`, each column's kept with it), built a
        field at a time from the jobs themselves: a field a plain getter gives (`VIEW`)
        makes no job dict at all, nor do the priority (`_priority`, the last pass's) and
        the start estimates (`_estimated`, the last estimate's); only the dependency and
        the spec go through the job dict, which says them as of now. Kept for the
        state's version (`ColumnsMemo`) unless they do."""
        users, names, accounts, partitions = (
            frozenset(users),
            frozenset(names),
            frozenset(accounts),
            frozenset(partitions),
        )
        through_dict = [f for f in fields if f not in VIEW or f == "dependency"]
        plain = tuple(f for f in fields if f not in through_dict and f not in _OF_PASSES)
        if states and all(s in _ACTIVE_NAMES for s in states):
            ended_after = None  # no job of those states has ended: the window cuts none
        key = (
            tenant,
            None if states is None else frozenset(states),
            None if ids is None else frozenset(ids),
            users,
            names,
            accounts,
            partitions,
            ended_after,
            plain,
        )
        with self.replica.lock:
            state = self.replica.state
            version = self.replica.version
            built = None if through_dict else self._memo.get(version, key)
            if built is None:
                chosen = sorted(
                    matching(
                        state, tenant, states, ids, users, names, accounts, partitions, ended_after
                    ),
                    key=attrgetter("job_id"),
                )
                kept = columns_answer(len(chosen), {f: list(map(VIEW[f], chosen)) for f in plain})
                built = Built(chosen, kept["columns"])
                if not through_dict:
                    self._memo.put(version, key, built)
            chosen = built.chosen
            columns = dict(built.columns)
            if "priority" in fields:
                # The entry holds the pass's factors it read: no other pass is the same.
                if built.of_pass is not self.priorities:
                    built.priority = list(map(self._priority, chosen))
                    built.of_pass = self.priorities
                columns["priority"] = built.priority
            for name in RESERVED:
                if name in fields:
                    # Likewise of one estimate, which may change with no command applied.
                    if built.of_estimate is not self.reservations:
                        built.estimated = {}
                        built.of_estimate = self.reservations
                    if name not in built.estimated:
                        built.estimated[name] = self._estimated(chosen, name)
                    columns[name] = built.estimated[name]
            if through_dict:
                now = time.time()
                dicts = [
                    self._with_pass(
                        job, state.job_dict(job, now, fields=through_dict), through_dict
                    )
                    for job in chosen
                ]
                through = {f: [d.get(f) for d in dicts] for f in through_dict}
                columns.update(columns_answer(len(chosen), through)["columns"])
        if not runs:
            return {"n": len(chosen), "columns": {f: columns[f] for f in fields}}
        # Outside the lock: an entry's lists are never changed once built. Two readers
        # may both encode a column; either's runs are the same.
        for name in plain:
            if name not in built.runs:
                built.runs[name] = encode_column(columns[name])
        kept_runs = built.runs
        answer = {f: kept_runs[f] if f in plain else encode_column(columns[f]) for f in fields}
        return {"n": len(chosen), "columns": answer}

    def job_view(self, state: ClusterState, job_id: int, now: float) -> dict[str, Any] | None:
        """A submitted job's view, built by the apply (the state locked): `job`'s."""
        job = state.jobs.get(job_id)
        if job is None:
            return None
        return self._with_pass(job, state.job_dict(job, now, with_spec=True))

    def job(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any] | None:
        with self.replica.lock:
            job = self.replica.state.lookup(job_id)  # an array's pending task too
            if job is None or (tenant is not None and job.spec.tenant != tenant):
                return None
            return self._with_pass(
                job, self.replica.state.job_dict(job, time.time(), with_spec=True)
            )

    def _with_pass(
        self, job: Job, out: dict[str, Any], fields: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """A pending job's priority and its factors, as the last pass ranked it (sprio),
        and when and where it is expected to start, as the last estimate reserved it
        (squeue --start), in its job dict `out`, cut to `fields` where given."""
        if job.state is not JobState.PENDING:
            return out
        if fields is None or "priority" in fields or "priority_factors" in fields:
            found = self.priorities.get(job.job_id)  # computed now: not for nothing
            if found is not None:
                factors = found.to_dict()
                if fields is None or "priority" in fields:
                    out["priority"] = factors["priority"]
                if fields is None or "priority_factors" in fields:
                    out["priority_factors"] = factors
        reserved = self.reservations.get(job.job_id)
        if reserved is not None:
            for name, value in RESERVED.items():
                if fields is None or name in fields:
                    out[name] = value(reserved)
        return out

    def _estimated(self, chosen: Sequence[Job], name: str) -> list[Any]:
        """The column `name` (of `RESERVED`) of `chosen` as `_with_pass` gives it, its
        times cut to the second as the columns answer has them."""
        unreserved, value = VIEW[name], RESERVED[name]
        reservations = self.reservations
        values = [
            unreserved(job)
            if job.state is not JobState.PENDING or (found := reservations.get(job.job_id)) is None
            else value(found)
            for job in chosen
        ]
        cut: list[Any] = columns_answer(len(chosen), {name: values})["columns"][name]
        return cut

    def _priority(self, job: Job) -> int:
        """A job's priority as `_with_pass` shows it: a pending job's as the last pass
        ranked it, any other's as it started (its own), without a dict per job."""
        if job.state is JobState.PENDING:
            found = self.priorities.get(job.job_id)
            if found is not None:
                return int(found.priority)
        return int(job.priority)


_ACTIVE_NAMES = frozenset(s.value for s in ACTIVE)


def matching(
    state: ClusterState,
    tenant: str | None,
    states: set[str] | None,
    ids: set[int] | None,
    users: Iterable[str],
    names: Iterable[str],
    accounts: Iterable[str],
    partitions: Iterable[str],
    ended_after: float | None,
) -> list[Job]:
    """The jobs of `state` that match every filter given (see `JobReads.jobs`), each
    pending task of an array's remainder on its own; under the lock. The jobs that `ids`
    name (a job, or every task of an array job) are looked up, not found by reading
    every job (`squeue -j 5` in a queue of 10,000)."""
    # Members, not names: a state's name is a property (Python code) per read, and this
    # reads one per job of the whole queue.
    wanted_states = None if not states else frozenset(s for s in JobState if s.value in states)
    by_value = [
        (getter, set(values))
        for getter, values in zip(_BY_VALUE, (users, names, accounts, partitions), strict=True)
        if values
    ]
    out = []
    for job in state.listed(ids):
        if tenant is not None and job.spec.tenant != tenant:
            continue
        if wanted_states is not None and job.state not in wanted_states:
            continue
        if ids is not None and job.job_id not in ids and job.array_job_id not in ids:
            continue
        if (
            ended_after is not None
            and job.state not in ACTIVE
            and (job.end_time or 0) < ended_after
        ):
            continue
        if by_value and not all(getter(job) in values for getter, values in by_value):
            continue
        out.append(job)
    return out


__all__ = ["MEMO_ANSWERS", "START_ESTIMATE_INTERVAL_S", "ColumnsMemo", "JobReads", "matching"]
