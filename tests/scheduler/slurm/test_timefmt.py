"""Slurm's time forms: --time parsing and the time columns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.slurm.timefmt import (
    format_duration,
    format_elapsed,
    format_limit,
    format_sacct_limit,
    format_sinfo_limit,
    format_timestamp,
    parse_iso,
    parse_slurm_datetime,
    parse_time_minutes,
)


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("5", 5),
        ("90", 90),
        ("1:30", 2),  # M:S, seconds round up
        ("0:01", 1),  # golden 40: --time=0:01 is a one-minute limit
        ("2:00", 2),
        ("1:00:00", 60),
        ("48:00:00", 2880),  # hours may exceed 23
        ("1:00:01", 61),
        ("2-0", 2880),
        ("1-12", 2160),
        ("1-2:30", 1590),
        ("1-0:0:30", 1441),
        (" 10 ", 10),
    ],
)
def test_it_parses_every_slurm_time_form(text: str, minutes: int) -> None:
    assert parse_time_minutes(text) == minutes


@pytest.mark.parametrize(
    "text", ["0", "UNLIMITED", "unlimited", "infinite", "INFINITE", "-1", "0:00"]
)
def test_zero_and_unlimited_mean_no_limit(text: str) -> None:
    assert parse_time_minutes(text) is None


@pytest.mark.parametrize(
    "text", ["bogus", "", "1.5", "1:2:3:4", "-5", "1-", "-1:00", "1-2-3", "1h", "1:", ":30", "1 2"]
)
def test_it_rejects_malformed_times_with_a_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match="invalid time specification"):
        parse_time_minutes(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0:00"),
        (3, "0:03"),
        (59, "0:59"),
        (60, "1:00"),
        (3723, "1:02:03"),
        (93784, "1-02:03:04"),
        (-5, "0:00"),
    ],
)
def test_elapsed_time_prints_like_squeue(seconds: int, text: str) -> None:
    assert format_elapsed(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "00:00:00"), (20, "00:00:20"), (68, "00:01:08"), (93784, "1-02:03:04")],
)
def test_durations_print_like_sacct(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


def test_limits_print_per_command() -> None:
    assert format_limit(None) == "UNLIMITED"
    assert format_limit(1) == "1:00"
    assert format_limit(1440) == "1-00:00:00"
    assert format_sinfo_limit(None) == "infinite"
    assert format_sinfo_limit(30) == "30:00"
    assert format_sacct_limit(1) == "00:01:00"
    assert format_sacct_limit(None) == "UNLIMITED"


def test_timestamps_print_in_local_time(utc: None) -> None:
    moment = parse_iso("2026-11-30T04:05:34Z")
    assert moment == datetime(2026, 11, 30, 4, 5, 34, tzinfo=UTC)
    assert format_timestamp(moment) == "2026-11-30T04:05:34"
    assert parse_iso(None) is None
    assert parse_iso("2026-11-30T04:05:34") == moment  # naive means UTC


NOW = datetime(2026, 11, 30, 15, 30, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("now-1hours", NOW - timedelta(hours=1)),
        ("now+30", NOW + timedelta(seconds=30)),
        ("now-2days", NOW - timedelta(days=2)),
        ("today", NOW.replace(hour=0, minute=0)),
        ("midnight", NOW.replace(hour=0, minute=0)),
        ("noon", NOW.replace(hour=12, minute=0)),
        ("tomorrow", NOW.replace(day=1, month=12, hour=0, minute=0)),
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
        ("2026-11-01T10:20", datetime(2026, 11, 1, 10, 20, tzinfo=UTC)),
        ("2026-11-01T10:20:30", datetime(2026, 11, 1, 10, 20, 30, tzinfo=UTC)),
        ("08:15", NOW.replace(hour=8, minute=15)),
        ("11/02", datetime(2026, 11, 2, tzinfo=UTC)),
        ("11/02/25", datetime(2025, 11, 2, tzinfo=UTC)),
    ],
)
def test_sacct_time_forms_are_understood(text: str, expected: datetime) -> None:
    assert parse_slurm_datetime(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday-ish", "2026-13-01", "now-1fortnights", ""])
def test_unknown_sacct_time_forms_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_slurm_datetime(text, NOW)
