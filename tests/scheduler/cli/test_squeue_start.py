"""`squeue --start`, `%S`/`%Y`/`%e` and `scontrol show job`'s StartTime and SchedNodeList,
compared byte for byte with what the Slurm 22.05.8 peer (shared/peers/slurm) printed.

The scene, captured on 2026-12-05 at 23:16:31 UTC: four 8-GPU jobs of 60 minutes fill
gpu[01-04] (12-15, started 23:05:26); queued behind them, an 8-GPU job of 30 minutes
(16), a 2-node one of 20 (17), a 1-GPU one without a limit (18), a held one (19), one
waiting on job 12 (20) and a 1-GPU job of 5 minutes (21). Slurm's backfill expected 16,
17 and 18 when the fill jobs end and 21 at 00:25:00 (when its own timeline frees gpu03;
ours would not estimate that one: a reservation of ours holds on past its job's end).
The golden file 25 has the case where no job has a reservation."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.cli import squeue
from scheduler.slurm.scontrol_format import job_record
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.scene import iso, job

NOW = datetime(2026, 12, 5, 23, 16, 31, tzinfo=UTC)
STARTED = datetime(2026, 12, 5, 23, 5, 26, tzinfo=UTC)
EXPECTED = datetime(2026, 12, 6, 0, 5, 26, tzinfo=UTC)


def pending(job_id: int, name: str, reason: str, priority: int, **kw: Any) -> dict[str, Any]:
    expected = kw.pop("expected", None)
    return job(
        job_id,
        name,
        "PENDING",
        reason=reason,
        submit=STARTED,
        priority=priority,
        expected_start=iso(expected),
        sched_nodes=kw.pop("sched", []),
        **kw,
    )


def peer_scene() -> list[dict[str, Any]]:
    fill = [
        job(
            12 + i,
            f"fill{i + 1}",
            "RUNNING",
            nodes=[f"gpu0{i + 1}"],
            gpus_per_node=8,
            submit=STARTED,
            start=STARTED,
            time_limit_min=60,
            priority=4294901748 - i,
            expected_start=None,
            sched_nodes=[],
        )
        for i in range(4)
    ]
    return [
        *fill,
        pending(
            16,
            "wait8",
            "Resources",
            4294901744,
            gpus_per_node=8,
            time_limit_min=30,
            expected=EXPECTED,
            sched=["gpu01"],
        ),
        pending(
            17,
            "wait2n",
            "Priority",
            4294901743,
            num_nodes=2,
            gpus_per_node=8,
            time_limit_min=20,
            expected=EXPECTED,
            sched=["gpu03", "gpu04"],
        ),
        pending(
            18,
            "waitnol",
            "Priority",
            4294901742,
            gpus_per_node=1,
            expected=EXPECTED,
            sched=["gpu02"],
        ),
        pending(19, "held", "JobHeldUser", 0, gpus_per_node=1, time_limit_min=10),
        pending(
            20,
            "dep",
            "Dependency",
            4294901741,
            gpus_per_node=1,
            time_limit_min=10,
            dependency="afterok:12(unfulfilled)",
        ),
        pending(
            21,
            "small",
            "Priority",
            4294901740,
            gpus_per_node=1,
            time_limit_min=5,
            expected=datetime(2026, 12, 6, 0, 25, tzinfo=UTC),
            sched=["gpu03"],
        ),
    ]


START = """\
             JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES           NODELIST(REASON)
                16       gpu    wait8     root PD 2026-12-06T00:05:26      1 gpu01                (Resources)
                17       gpu   wait2n     root PD 2026-12-06T00:05:26      2 gpu[03-04]           (Priority)
                18       gpu  waitnol     root PD 2026-12-06T00:05:26      1 gpu02                (Priority)
                21       gpu    small     root PD 2026-12-06T00:25:00      1 gpu03                (Priority)
                19       gpu     held     root PD                 N/A      1 (null)               (JobHeldUser)
                20       gpu      dep     root PD                 N/A      1 (null)               (Dependency)
"""  # noqa: E501

START_WITH_RUNNING = """\
             JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES           NODELIST(REASON)
                12       gpu    fill1     root  R 2026-12-05T23:05:26      1 (null)               gpu01
                13       gpu    fill2     root  R 2026-12-05T23:05:26      1 (null)               gpu02
                14       gpu    fill3     root  R 2026-12-05T23:05:26      1 (null)               gpu03
                15       gpu    fill4     root  R 2026-12-05T23:05:26      1 (null)               gpu04
""" + "".join(START.splitlines(keepends=True)[1:])  # noqa: E501

START_LETTERS = """\
JOBID START_TIME SCHEDNODES END_TIME
16 2026-12-06T00:05:26 gpu01 2026-12-06T00:35:26
17 2026-12-06T00:05:26 gpu[03-04] 2026-12-06T00:25:26
18 2026-12-06T00:05:26 gpu02 NONE
21 2026-12-06T00:25:00 gpu03 2026-12-06T00:30:00
19 N/A (null) N/A
20 N/A (null) N/A
"""

START_NAMES = """\
JOBID               START_TIME          SCHEDNODES          STATE               
16                  2026-12-06T00:05:26 gpu01               PENDING             
17                  2026-12-06T00:05:26 gpu[03-04]          PENDING             
18                  2026-12-06T00:05:26 gpu02               PENDING             
20                  N/A                 (null)              PENDING             
21                  2026-12-06T00:25:00 gpu03               PENDING             
19                  N/A                 (null)              PENDING             
12                  2026-12-05T23:05:26 (null)              RUNNING             
13                  2026-12-05T23:05:26 (null)              RUNNING             
14                  2026-12-05T23:05:26 (null)              RUNNING             
15                  2026-12-05T23:05:26 (null)              RUNNING             
"""  # noqa: W291


class _FrozenClock:
    @staticmethod
    def now(tz: object = None) -> datetime:
        return NOW


@pytest.fixture
def peer(fake_api: FakeApi, utc: None, monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake_api.queue = peer_scene()
    monkeypatch.setattr(squeue, "datetime", _FrozenClock)
    return fake_api


def test_start_lists_pending_jobs_by_expected_start_as_slurm_does(
    peer: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert squeue.main(["--start"]) == 0
    assert capsys.readouterr() == (START, "")


def test_start_keeps_a_format_given_and_its_own_order(
    peer: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert squeue.main(["--start", "-o", "%i %S %Y %e"]) == 0
    assert capsys.readouterr() == (START_LETTERS, "")


def test_start_with_states_lists_those_by_start_time(
    peer: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert squeue.main(["--start", "-t", "R,PD"]) == 0
    assert capsys.readouterr() == (START_WITH_RUNNING, "")


def test_start_time_and_sched_nodes_are_long_fields_too(
    peer: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert squeue.main(["-O", "JobID,StartTime,SchedNodes,State"]) == 0
    assert capsys.readouterr() == (START_NAMES, "")


def test_start_overrides_long_fields_and_the_environments_format(
    peer: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As Slurm's: -O leaves --start's layout in place, and so does SQUEUE_FORMAT.
    assert squeue.main(["--start", "-O", "JobID"]) == 0
    assert capsys.readouterr() == (START, "")
    monkeypatch.setenv("SQUEUE_FORMAT", "%i %j")
    assert squeue.main(["--start"]) == 0
    assert capsys.readouterr() == (START, "")


# `scontrol show job` of the same jobs: the lines that say when and where.
SCONTROL = {
    17: (
        "StartTime=2026-12-06T00:05:26 EndTime=2026-12-06T00:25:26 Deadline=N/A",
        "NodeList= SchedNodeList=gpu[03-04]",
    ),
    18: (
        "StartTime=2026-12-06T00:05:26 EndTime=Unknown Deadline=N/A",
        "NodeList= SchedNodeList=gpu02",
    ),
    20: ("StartTime=Unknown EndTime=Unknown Deadline=N/A", "NodeList="),
}


@pytest.mark.parametrize("job_id", sorted(SCONTROL))
def test_scontrol_shows_a_pending_jobs_expected_start_and_nodes(utc: None, job_id: int) -> None:
    (found,) = [j for j in peer_scene() if j["job_id"] == job_id]
    record = job_record(found, now=NOW)
    start, nodes = SCONTROL[job_id]
    assert start in record
    assert record[record.index(start) + 4] == nodes  # three lines below, as Slurm's


def test_a_job_waiting_for_its_begin_time_shows_it(
    fake_api: FakeApi, utc: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Captured apart, at 23:35:25: `sbatch --begin=now+1hour -t 5`."""
    begins = datetime(2026, 12, 6, 0, 35, 25, tzinfo=UTC)
    later = job(1625, "later", "PENDING", reason="BeginTime", gpus_per_node=1,
                time_limit_min=5, expected_start=iso(begins), sched_nodes=[])  # fmt: skip
    fake_api.queue = [later]
    assert squeue.main(["--start", "-j", "1625"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "              1625       gpu    later     root PD 2026-12-06T00:35:25      1 (null)"
        "               (BeginTime)"
    )
    record = job_record(later, now=NOW)
    assert "StartTime=2026-12-06T00:35:25 EndTime=2026-12-06T00:40:25 Deadline=N/A" in record
    assert "NodeList=" in record
