"""What may be done to a job after submitting: Slurm's scancel and scontrol verbs. Most
are its owner's; `operator_only` ones (suspend, resume) a cluster operator's alone.

The web API's and the controller's URL patterns (`/jobs/{id}/{action}`), the
controller's dispatch table (`commands.ACTION_COMMANDS`) and the web service are built
from this enum; a test checks that they agree.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class JobAction(StrEnum):
    help: str
    takes_signal: bool
    operator_only: bool  # only a cluster operator may (Slurm: an administrator)

    def __new__(cls, value: str, *info: Any) -> JobAction:
        # `JobAction("cancel")` looks a member up by value and never gets here; the
        # members' definitions below do, with their help and whether they take a signal.
        member = str.__new__(cls, value)
        member._value_ = value
        member.help = str(info[0])
        member.takes_signal = bool(info[1]) if len(info) > 1 else False
        member.operator_only = bool(info[2]) if len(info) > 2 else False
        return member

    CANCEL = (
        "cancel",
        "Cancel the job, or with `signal` only send it that signal (scancel [--signal]).",
        True,
    )
    HOLD = "hold", "Keep a pending job from starting (scontrol hold)."
    RELEASE = "release", "Let a held job start again (scontrol release)."
    REQUEUE = "requeue", "Stop a running job and queue it again (scontrol requeue)."
    REQUEUEHOLD = "requeuehold", "Requeue a running job, held (scontrol requeuehold)."
    RESUME = (
        "resume",
        "Let a suspended job run on (scontrol resume). Operators only.",
        False,
        True,
    )
    SUSPEND = (
        "suspend",
        "Stop a running job, keeping its resources (scontrol suspend). Operators only.",
        False,
        True,
    )


# Signals a job may be sent: 1..64 (Linux's SIGRTMAX); 0 would only probe.
MIN_SIGNAL, MAX_SIGNAL = 1, 64

__all__ = ["MAX_SIGNAL", "MIN_SIGNAL", "JobAction"]
