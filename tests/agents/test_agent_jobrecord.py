"""A job's record in the spool (agents/jobrecord.py)."""

from __future__ import annotations

import json
from pathlib import Path

from agents import jobrecord


def _supervisor_line(jobdir: Path, text: str) -> None:
    """A line as the job supervisor appends it (agents/jobsupervisor.py)."""
    with (jobdir / "launch.json").open("a") as record:
        record.write(text)


def test_the_record_reads_each_fact_appended_after_the_launch(tmp_path: Path) -> None:
    jobdir = tmp_path / "5.1"
    jobdir.mkdir()
    jobrecord.claim(jobdir, {"job_id": 5, "attempt": 1})
    _supervisor_line(jobdir, '{"running": [123, 456]}\n')
    assert jobrecord.read(jobdir).running == (123, 456)
    jobrecord.append(jobdir, run={"uid": 1000, "processes": "1 2 3 4\n"})
    jobrecord.append(jobdir, signal=15)
    _supervisor_line(jobdir, '{"status": 143}\n')
    jobrecord.append(jobdir, exit=[0, 15])
    record = jobrecord.read(jobdir)
    assert record.launch == {"job_id": 5, "attempt": 1}
    assert record.run == {"uid": 1000, "processes": "1 2 3 4\n"}
    assert (record.signals, record.status, record.exit) == ({15}, 143, (0, 15))
    assert record.running is None  # it ended
    assert jobrecord.read(jobdir, launch=False).launch is None


def test_a_line_cut_short_by_a_death_is_left_out(tmp_path: Path) -> None:
    jobdir = tmp_path / "6.1"
    jobdir.mkdir()
    jobrecord.claim(jobdir, {"job_id": 6})
    jobrecord.append(jobdir, signal=2)
    _supervisor_line(jobdir, '{"status": 1')  # torn
    record = jobrecord.read(jobdir)
    assert (record.signals, record.status) == ({2}, None)


def test_the_files_of_an_agent_of_an_earlier_version_are_read(tmp_path: Path) -> None:
    # So that an agent upgraded under running jobs adopts them, or reports their end.
    jobdir = tmp_path / "7.1"
    jobdir.mkdir()
    (jobdir / "launch.json").write_text(json.dumps({"job_id": 7}))  # no newline
    (jobdir / "run.json").write_text(json.dumps({"processes": "1 2 3 4\n"}, indent=1))
    (jobdir / "signals").write_text("15\n9\n")
    (jobdir / "status").write_text("137\n")
    (jobdir / "exit").write_text("0 9\n")
    record = jobrecord.read(jobdir)
    assert record.launch == {"job_id": 7}
    assert record.run == {"processes": "1 2 3 4\n"}
    assert (record.signals, record.status, record.exit) == ({15, 9}, 137, (0, 9))


def test_a_launch_never_described_reads_as_none(tmp_path: Path) -> None:
    jobdir = tmp_path / "8.1"
    jobdir.mkdir()
    assert jobrecord.read(jobdir) == jobrecord.JobRecord()
    (jobdir / "launch.json").write_text('{"job_id": 8, "att')
    assert jobrecord.read(jobdir).launch is None
