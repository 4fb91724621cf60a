"""How the portal shows a job's facts, from the contract and Slurm's formats: the badge
of a state (by its kind), the exit status as sacct prints it, a reason only where it
says something, times in the viewer's time zone with the zone said (portal/timezones.py),
sizes in binary units."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone

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
def when(iso: str | None) -> str:
    """An ISO 8601 time of a job object in the zone active for this answer, with the
    zone: `2026-12-01T08:00:05Z` -> `2026-12-01 09:00:05 CET` (UTC when the viewer's zone
    is unknown)."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(timezone.get_current_timezone()).strftime("%Y-%m-%d %H:%M:%S %Z")


@register.filter
def mebibytes(mb: object) -> str:
    """A size the scheduler counts in MB (MiB, as Slurm does) in readable units:
    `2097152` -> `2 TiB`, `81920` -> `80 GiB`, `512` -> `512 MiB`."""
    if isinstance(mb, bool) or not isinstance(mb, int | float):
        return ""
    for unit, size in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if mb >= size:
            return f"{mb / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{int(mb)} MiB"


@register.filter
def get_item(mapping: dict[str, str], key: str) -> str:
    """`mapping[key]`, "" when absent (the catalog's price of a GPU model)."""
    return mapping.get(key, "")
