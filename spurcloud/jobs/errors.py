"""What the job services raise besides the controller client's own errors (the RPC
kit's `Refused`, `Conflict` and `Unavailable` pass through: the API answers them with
400, 409 and 503)."""

from __future__ import annotations


class JobRejected(Exception):
    """A submission or action refused as invalid, with a message for the user (400);
    `field`: the spec field at fault, when one is."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def job_not_found_message(job_id: int) -> str:
    # One message for "missing" and "another organisation's": the answer must not tell them
    # apart.
    return f"Job {job_id} not found."


class JobOutputUnavailable(Exception):
    """A job's output cannot be read now: its node, or the scheduler that knows where the
    node is, cannot be reached (503)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
