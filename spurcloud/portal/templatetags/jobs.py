"""How the portal shows a job's facts, from the contract and Slurm's formats: the badge
of a state (by its kind), the exit status as sacct prints it, a reason only where it
says something, and times in UTC, said so."""

from __future__ import annotations

from datetime import datetime

from django import template

from scheduler.core.contract import JobState
from scheduler.slurm.states import exit_code_text

register = template.Library()


@register.filter
def state_kind(state: str) -> str:
    try:
        return JobState(state).kind.value
    except ValueError:
        return "unknown"


@register.filter
def exit_text(job: dict[str, object]) -> str:
    """`code:signal` as sacct's job row shows it, once the job is over; else nothing."""
    state = str(job.get("state", ""))
    if state not in {s.value for s in JobState if s.is_terminal}:
        return ""
    code, signal = job.get("exit_code"), job.get("signal")
    return exit_code_text(
        state,
        int(code) if isinstance(code, int) else None,
        int(signal) if isinstance(signal, int) else None,
        step=False,
    )


@register.filter
def reason_text(reason: str) -> str:
    return "" if reason in ("", "None") else reason


@register.filter
def utc(iso: str | None) -> str:
    """`2026-12-01T08:00:05Z` -> `2026-12-01 08:00:05 UTC`."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
