"""Slurm's job state names: long (`PENDING`), compact (`PD`), and the `-t/--states` and
`-s/--state` lists of squeue, scancel and sacct.

Spur's own states, their codes and whether they are active come from the contract
(`JobState`); what is added here is only Slurm's vocabulary for states Spur never
enters, which users may still name in a filter (`squeue -t S` must parse, and match
nothing).
"""

from __future__ import annotations

from scheduler.core.contract import JobState

# Slurm states Spur never enters: name -> (compact code, active).
SLURM_ONLY: dict[str, tuple[str, bool]] = {
    "CONFIGURING": ("CF", True),
    "BOOT_FAIL": ("BF", False),
    "DEADLINE": ("DL", False),
    "REQUEUED": ("RQ", True),
    "REQUEUE_HOLD": ("RH", True),
    "REQUEUE_FED": ("RF", True),
    "RESIZING": ("RS", True),
    "REVOKED": ("RV", False),
    "SIGNALING": ("SI", True),
    "SPECIAL_EXIT": ("SE", False),
    "STAGE_OUT": ("SO", True),
    "STOPPED": ("ST", True),
    "RESV_DEL_HOLD": ("RD", True),
}

COMPACT: dict[str, str] = {
    **{s.value: s.code for s in JobState},
    **{name: code for name, (code, _) in SLURM_ONLY.items()},
}
_BY_COMPACT = {short: long for long, short in COMPACT.items()}

# What squeue lists when not given -t: jobs that still hold or wait for resources.
ACTIVE = frozenset(
    {s.value for s in JobState if s.is_active}
    | {name for name, (_, active) in SLURM_ONLY.items() if active}
)
TERMINAL = frozenset(COMPACT) - ACTIVE

# Slurm's job_state enum order, which squeue's default sort (`t`) follows: Spur's
# states are declared in it; Slurm's others take their places between them.
_ORDERED = [s.value for s in JobState]
_at = _ORDERED.index(JobState.PREEMPTED.value) + 1
_ORDERED[_at:_at] = ["BOOT_FAIL", "DEADLINE"]
ORDER: dict[str, int] = {name: index for index, name in enumerate(_ORDERED)}


def compact(state: str) -> str:
    return COMPACT.get(state.upper(), state[:2].upper())


def parse_states(text: str) -> frozenset[str] | None:
    """`PD,R`, `pending,running` or `all` to long names; None means every state.

    Raises ValueError naming the first word that is not a state.
    """
    chosen: set[str] = set()
    for word in text.split(","):
        item = word.strip().upper()
        if not item:
            continue
        if item == "ALL":
            return None
        if item in COMPACT:
            chosen.add(item)
        elif item in _BY_COMPACT:
            chosen.add(_BY_COMPACT[item])
        elif item == "CANCELED":  # Slurm takes the American spelling too
            chosen.add(JobState.CANCELLED.value)
        else:
            raise ValueError(f"Invalid job state specified: {word.strip()}")
    return frozenset(chosen)


def exit_code_text(state: str, exit_code: int | None, signal: int | None, *, step: bool) -> str:
    """sacct's ExitCode, `exit:signal`. A cancelled or timed-out job's own row keeps
    `code:0` (its state says what happened); the signal that ended it shows on its
    step's row (`.batch`), `:15` when the controller's kill was the SIGTERM."""
    code, sig = int(exit_code or 0), int(signal or 0)
    if state in (JobState.CANCELLED, JobState.TIMEOUT):
        return f"{code}:{sig or 15}" if step else f"{code}:0"
    return f"{code}:{sig}"


__all__ = [
    "ACTIVE",
    "COMPACT",
    "ORDER",
    "SLURM_ONLY",
    "TERMINAL",
    "compact",
    "exit_code_text",
    "parse_states",
]
