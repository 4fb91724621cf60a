"""Slurm's job state names: long (`PENDING`), compact (`PD`), and the `-t/--states` and
`-s/--state` lists of squeue, scancel and sacct."""

from __future__ import annotations

COMPACT: dict[str, str] = {
    "PENDING": "PD",
    "RUNNING": "R",
    "SUSPENDED": "S",
    "COMPLETING": "CG",
    "COMPLETED": "CD",
    "CANCELLED": "CA",
    "FAILED": "F",
    "TIMEOUT": "TO",
    "NODE_FAIL": "NF",
    "PREEMPTED": "PR",
    "BOOT_FAIL": "BF",
    "DEADLINE": "DL",
    "OUT_OF_MEMORY": "OOM",
    "REQUEUED": "RQ",
    "REQUEUE_HOLD": "RH",
    "REQUEUE_FED": "RF",
    "RESIZING": "RS",
    "REVOKED": "RV",
    "SIGNALING": "SI",
    "SPECIAL_EXIT": "SE",
    "STAGE_OUT": "SO",
    "STOPPED": "ST",
    "CONFIGURING": "CF",
    "RESV_DEL_HOLD": "RD",
}
_BY_COMPACT = {short: long for long, short in COMPACT.items()}

# What squeue lists when not given -t: jobs that still hold or wait for resources.
ACTIVE = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING"})
TERMINAL = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)

# Slurm's job_state enum order, which squeue's default sort (`t`) follows.
ORDER: dict[str, int] = {
    name: index
    for index, name in enumerate(
        (
            "PENDING",
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
            "COMPLETED",
            "CANCELLED",
            "FAILED",
            "TIMEOUT",
            "NODE_FAIL",
            "PREEMPTED",
            "BOOT_FAIL",
            "DEADLINE",
            "OUT_OF_MEMORY",
        )
    )
}


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
        elif item == "CANCELED":
            chosen.add("CANCELLED")
        else:
            raise ValueError(f"Invalid job state specified: {word.strip()}")
    return frozenset(chosen)
