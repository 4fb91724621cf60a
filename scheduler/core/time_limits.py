"""A job's time limit under its partition: the one rule, read by the state machine
(submit, `scontrol update`) and by the controller before a submission reaches the Raft
log (`Controller.submit`), so that a refused limit costs no log entry.

No time limit asked: the partition's default, else its maximum. A limit of 0 (Slurm's
"UNLIMITED") or one above the partition's maximum is refused with Slurm's message.
"""

from __future__ import annotations

from scheduler.core.commands import PartitionDef
from scheduler.core.errors import Rejected

TIME_LIMIT_REFUSED = "Requested time limit is invalid (missing or exceeds some limit)"


def job_time_limit(part: PartitionDef, requested: int | None) -> int | None:
    """The time limit (minutes) a job asking for `requested` gets in `part`; Rejected
    (code `time_limit`) when the partition's maximum does not allow it."""
    if requested is None:
        return part.default_time_min if part.default_time_min else part.max_time_min
    if part.max_time_min is not None and (requested == 0 or requested > part.max_time_min):
        raise Rejected(TIME_LIMIT_REFUSED, code="time_limit")
    return requested
