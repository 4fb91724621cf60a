"""Slurm's time formats: `--time` parsing, the elapsed/limit columns of squeue, sinfo and
sacct, timestamps, and the date forms `sacct -S/-E` accepts.

Every printer here mirrors a function of Slurm 22.05 (`secs2time_str`, `mins2time_str`,
`slurm_make_time_str` with the default `%FT%T` format), so columns match byte for byte.
"""

from __future__ import annotations

import time

from scheduler.slurm.lazyre import LazyPattern

# The commands read their columns' times as epoch seconds (`format_epoch`,
# `run_seconds_of`) and never import `datetime` for them; the functions that take or
# make datetimes import it where they run.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime
    from typing import Any

UNLIMITED_WORDS = frozenset({"-1", "infinite", "unlimited"})

_TIME_RE = LazyPattern(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_minutes(text: str) -> int | None:
    """Parse a `--time` value into whole minutes; None means no limit.

    Forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`, and `0`, `UNLIMITED`,
    `infinite` for no limit (in Slurm a limit of zero means none). Seconds round up to
    the next minute, as Slurm's `time_str2mins` does.
    """
    value = text.strip()
    if value.lower() in UNLIMITED_WORDS:
        return None
    match = _TIME_RE.match(value)
    if match is None:
        raise ValueError(
            f"invalid time specification {text!r}: expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"
        )
    days_s, first, second, third = match.groups()
    days = int(days_s) if days_s is not None else 0
    a = int(first)
    b = int(second) if second is not None else None
    c = int(third) if third is not None else None
    if days_s is not None:
        # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = a, b or 0, c or 0
    elif c is not None:
        hours, minutes, seconds = a, b or 0, c
    elif b is not None:
        hours, minutes, seconds = 0, a, b
    else:
        hours, minutes, seconds = 0, a, 0
    total_seconds = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    total_minutes = -(-total_seconds // 60)
    return total_minutes or None


def format_elapsed(seconds: float | int) -> str:
    """squeue's TIME column (`secs2time_str`): `0:03`, `1:02:03`, `1-02:03:04`."""
    secs = max(int(seconds), 0)
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def format_duration(seconds: float | int) -> str:
    """sacct's Elapsed column: `00:00:20`, `1-02:03:04`."""
    secs = max(int(seconds), 0)
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def format_limit(minutes: int | None) -> str:
    """squeue's TIME_LIMIT column: `UNLIMITED`, `1:00`, `2:00:00`, `1-00:00:00`."""
    if minutes is None:
        return "UNLIMITED"
    return format_elapsed(minutes * 60)


def format_sinfo_limit(minutes: int | None) -> str:
    """sinfo's TIMELIMIT column, where no limit reads `infinite`."""
    if minutes is None:
        return "infinite"
    return format_elapsed(minutes * 60)


def format_sacct_limit(minutes: int | None) -> str:
    """sacct's Timelimit column: `00:01:00` or `UNLIMITED`."""
    if minutes is None:
        return "UNLIMITED"
    return format_duration(minutes * 60)


# What `run_seconds` reads of a job object.
RUN_FIELDS = ("start_time", "end_time", "suspended_at", "suspended_s")


def run_seconds(job: Mapping[str, Any], now: datetime) -> float:
    """How long the job has run (squeue's TIME, scontrol's RunTime): from its start to its
    end, or to now, less the time it spent suspended, as Slurm counts it."""
    start = parse_iso(job.get("start_time"))
    if start is None:
        return 0.0
    end = parse_iso(job.get("end_time")) or parse_iso(job.get("suspended_at")) or now
    return max((end - start).total_seconds() - float(job.get("suspended_s") or 0), 0.0)


def parse_iso(text: str | None) -> datetime | None:
    """The web API's ISO 8601 UTC timestamps (`2026-11-30T04:05:34Z`) to aware datetimes."""
    from datetime import UTC, datetime

    if not text:
        return None
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def run_seconds_of(
    start: float | None,
    end: float | None,
    suspended_at: float | None,
    suspended_s: float | None,
    now: float,
) -> float:
    """`run_seconds` from a columns answer's values (epoch seconds): the same count."""
    if start is None:
        return 0.0
    stop = end if end is not None else suspended_at if suspended_at is not None else now
    return max(stop - start - float(suspended_s or 0), 0.0)


def format_epoch(seconds: float) -> str:
    """`format_timestamp` of an epoch second: Slurm's timestamp in the local time zone."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def format_timestamp(moment: datetime) -> str:
    """Slurm's timestamp (`2026-11-30T04:05:34`), in the local time zone like Slurm."""
    if moment.tzinfo is not None:
        moment = moment.astimezone()
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def format_banner_time(moment: datetime) -> str:
    """The first line of `sinfo -l`: `Mon Nov 30 04:05:34 2026` (ctime, local time)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone()
    return moment.strftime("%a %b %d %H:%M:%S %Y")


_NOW_RE = LazyPattern(r"^now(?:([+-])(\d+)(seconds?|minutes?|hours?|days?|weeks?|[smhdw])?)?$")
_UNITS = {
    "": 1,
    "s": 1,
    "seconds": 1,
    "m": 60,
    "minutes": 60,
    "h": 3600,
    "hours": 3600,
    "d": 86400,
    "days": 86400,
    "w": 604800,
    "weeks": 604800,
}
_DATE_FORMATS = (
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d",
)


def parse_slurm_datetime(text: str, now: datetime) -> datetime:
    """The time forms of `sacct -S/-E` (Slurm's `parse_time`), in `now`'s time zone.

    `YYYY-MM-DD[THH:MM[:SS]]`, `MM/DD[/YY]`, `HH:MM[:SS]` (today), `now[+-N[unit]]`,
    `today`, `midnight`, `noon`, `tomorrow`.
    """
    from datetime import datetime, timedelta

    value = text.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if value in ("today", "midnight"):
        return midnight
    if value == "noon":
        return midnight.replace(hour=12)
    if value == "tomorrow":
        return midnight + timedelta(days=1)
    match = _NOW_RE.match(value)
    if match is not None:
        sign, count, unit = match.groups()
        if sign is None:
            return now
        # Slurm counts a bare `now+N` in seconds.
        unit = unit or ""
        delta = timedelta(seconds=int(count) * _UNITS[unit if unit in _UNITS else unit + "s"])
        return now + delta if sign == "+" else now - delta
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(value.upper(), fmt).replace(tzinfo=now.tzinfo)
        except ValueError:
            continue
    for fmt in ("%H:%M:%S", "%H:%M"):
        try:
            clock = datetime.strptime(value, fmt)
        except ValueError:
            continue
        return midnight.replace(hour=clock.hour, minute=clock.minute, second=clock.second)
    for fmt in ("%m/%d/%y", "%m/%d"):
        try:
            day = datetime.strptime(value, fmt)
        except ValueError:
            continue
        year = day.year if fmt == "%m/%d/%y" else now.year
        return midnight.replace(year=year, month=day.month, day=day.day)
    raise ValueError(f"invalid time specification {text!r}")
