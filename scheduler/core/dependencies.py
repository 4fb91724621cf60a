"""Job dependencies: Slurm's `--dependency` expressions, and whether they are met.

`afterok:12:13,afterany:14` (all of them) or `afterok:12?afternotok:13` (any of them);
kinds `after[:id[+min]]`, `afterok`, `afternotok`, `afterany`, `aftercorr`, `singleton`.
A job id that is an array job names every task of the array; `12_3` names one task.

Each term is `fulfilled`, `unfulfilled` or `failed` (it can never be met: squeue's
`DependencyNeverSatisfied`; Slurm keeps such a job pending until someone cancels it).
It is evaluated from the state each time, never cached, so replicas cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.core.contract.states import JobState
from scheduler.core.errors import Rejected

if TYPE_CHECKING:
    from scheduler.core.jobs import Job

KINDS = ("after", "afterok", "afternotok", "afterany", "aftercorr", "singleton")
BAD_DEPENDENCY = "Job dependency problem"
FULFILLED, UNFULFILLED, FAILED = "fulfilled", "unfulfilled", "failed"
_REF = re.compile(r"^(\d+)(?:_(\d+))?(?:\+(\d+))?$")


@dataclass(frozen=True)
class DepTerm:
    kind: str
    job_id: int = 0  # the job, or the array job, named (0 for singleton)
    task: int | None = None  # `12_3`: one task of array 12
    delay_min: int = 0  # `after:12+10`: ten minutes after 12 started

    def __str__(self) -> str:
        if self.kind == "singleton":
            return "singleton"
        ref = str(self.job_id) if self.task is None else f"{self.job_id}_{self.task}"
        return f"{self.kind}:{ref}" + (f"+{self.delay_min}" if self.delay_min else "")


@dataclass(frozen=True)
class Dependency:
    terms: tuple[DepTerm, ...]
    any_of: bool = False  # `?`-separated: one fulfilled term is enough


def parse_dependency(text: str) -> Dependency | None:
    text = text.strip()
    if not text:
        return None
    if "?" in text and "," in text:
        raise _bad(text, "',' and '?' cannot be mixed")
    any_of = "?" in text
    terms: list[DepTerm] = []
    for piece in text.split("?" if any_of else ","):
        kind, _, refs = piece.partition(":")
        if kind not in KINDS:
            raise _bad(text, f"unknown kind {kind!r}")
        if kind == "singleton":
            if refs:
                raise _bad(text, "singleton takes no job ids")
            terms.append(DepTerm("singleton"))
            continue
        if not refs:
            raise _bad(text, f"{kind} needs job ids")
        for ref in refs.split(":"):
            m = _REF.match(ref)
            if m is None or (m.group(3) and kind != "after"):
                raise _bad(text, f"bad job id {ref!r}")
            task = int(m.group(2)) if m.group(2) is not None else None
            terms.append(DepTerm(kind, int(m.group(1)), task, int(m.group(3) or 0)))
    return Dependency(tuple(terms), any_of)


def _bad(text: str, why: str) -> Rejected:
    return Rejected(f"{BAD_DEPENDENCY}: {why} in {text!r}", code="invalid_dependency")


Targets = Callable[[DepTerm], "list[Job] | None"]  # None: the named job is unknown


def term_status(
    term: DepTerm,
    job: Job,
    targets: list[Job],
    now: float,
    singleton_blocked: Callable[[Job], bool],
) -> str:
    if term.kind == "singleton":
        return UNFULFILLED if singleton_blocked(job) else FULFILLED
    if term.kind == "aftercorr" and job.array_task_id is not None:
        # The task with the same index, when the named job is an array that has one.
        same = [t for t in targets if t.array_task_id == job.array_task_id]
        targets = same or targets
    ended = [t.state.is_terminal for t in targets]
    ok = [t.state is JobState.COMPLETED for t in targets]
    if term.kind == "after":
        started = all(
            t.state.is_terminal
            or (t.start_time is not None and now >= t.start_time + 60 * term.delay_min)
            for t in targets
        )
        return FULFILLED if started else UNFULFILLED
    if term.kind == "afterany":
        return FULFILLED if all(ended) else UNFULFILLED
    if term.kind in ("afterok", "aftercorr"):
        if any(e and not k for e, k in zip(ended, ok, strict=True)):
            return FAILED
        return FULFILLED if all(ok) else UNFULFILLED
    # afternotok: the named jobs all ended, and not all of them successfully.
    if not all(ended):
        return UNFULFILLED
    return FAILED if all(ok) else FULFILLED


def statuses(
    dep: Dependency,
    job: Job,
    targets: Targets,
    now: float,
    singleton_blocked: Callable[[Job], bool],
) -> list[tuple[DepTerm, str]]:
    out = []
    for term in dep.terms:
        found = [] if term.kind == "singleton" else targets(term)
        # A job that is gone was purged after ending; purging spares jobs that an active
        # job depends on, so this is only reachable for a job that ended long ago.
        status = (
            FULFILLED if found is None else term_status(term, job, found, now, singleton_blocked)
        )
        out.append((term, status))
    return out


def verdict(dep: Dependency, found: list[tuple[DepTerm, str]]) -> str:
    """FULFILLED, UNFULFILLED (pending reason Dependency) or FAILED (never satisfied)."""
    states = [s for _, s in found]
    if dep.any_of:
        if FULFILLED in states:
            return FULFILLED
        return FAILED if all(s == FAILED for s in states) else UNFULFILLED
    if FAILED in states:
        return FAILED
    return UNFULFILLED if UNFULFILLED in states else FULFILLED


def describe(dep: Dependency, found: list[tuple[DepTerm, str]]) -> str:
    """squeue's %E: the terms not yet met, with their state; `(null)` when none are."""
    left = [f"{term}({status})" for term, status in found if status != FULFILLED]
    return ("?" if dep.any_of else ",").join(left) or "(null)"


def referenced(dep: Dependency | None) -> Mapping[int, None]:
    return {} if dep is None else {t.job_id: None for t in dep.terms if t.kind != "singleton"}


__all__ = ["DepTerm", "Dependency", "describe", "parse_dependency", "statuses", "verdict"]
