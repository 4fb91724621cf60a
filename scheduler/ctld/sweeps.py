"""What the leader ends and forgets on a timer, not on every scheduling pass: the
running jobs past their time limit (once a second), the jobs that ended long ago (every
few seconds). Each reads the state under the replica's lock and commits what it found.

The time limits are read from the nodes' jobs, not from every job the state keeps: a
queue of 50,000 pending jobs holds no node, and a pass every few milliseconds used to
copy and scan them all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.errors import Rejected
from scheduler.ctld.replica import Replica

log = logging.getLogger(__name__)


def end_overdue_jobs(replica: Replica, new_id: Callable[[], str]) -> None:
    """Commit `TimeLimitReached` for each running job past its time limit."""
    now = time.time()
    with replica.lock:
        state = replica.state
        held = {job_id for node in state.nodes.values() for job_id in node.jobs}
        # The deadline counts running time only: not while or since it was suspended.
        overdue = [
            (j.job_id, j.attempt)
            for job_id in sorted(held)
            if (j := state.jobs.get(job_id)) is not None
            and j.state is JobState.RUNNING
            and (deadline := j.run_deadline()) is not None
            and now > deadline
        ]
    limits = [c.TimeLimitReached(new_id(), now, job_id, attempt) for job_id, attempt in overdue]
    for command, result in zip(limits, replica.commit_all(limits), strict=True):
        if isinstance(result, Rejected):  # it ended meanwhile
            log.info("time limit %s not applied: %s", command.cmd_id, result.message)


def forget_ended_jobs(replica: Replica, new_id: Callable[[], str], min_age_s: float) -> None:
    """Commit `PurgeJobs` if a job ended more than `min_age_s` ago."""
    now = time.time()
    cutoff = now - min_age_s
    with replica.lock:
        purge = any(
            j.state.is_terminal and j.end_time and j.end_time < cutoff
            for j in replica.state.jobs.values()
        )
    if purge:
        replica.commit(c.PurgeJobs(new_id(), now, ended_before=cutoff))
