"""What the job services raise besides the controller client's own errors
(`ControllerUnavailable` passes through: the API answers it with 503)."""

from __future__ import annotations


class JobRejected(Exception):
    """A submission or cancellation refused as invalid, with a message for the user (400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def job_not_found_message(job_id: int) -> str:
    # One message for "missing" and "another organisation's": the answer must not tell them
    # apart.
    return f"Job {job_id} not found."
