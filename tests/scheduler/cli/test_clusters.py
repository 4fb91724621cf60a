"""`-M/--clusters` in sbatch, squeue, sinfo, scancel and sacct, against a web API on
loopback. The expected bytes are Slurm 22.05.8's, taken on the Slurm peer
(../shared/peers/slurm, cluster `slurmpeer`, here `spur`)."""

from __future__ import annotations

import pytest

from scheduler.cli import sacct, sbatch, scancel, sinfo, squeue
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.slurm.scene import job, nodes, partitions

UNKNOWN = "{prog}: error: No cluster '{name}' known by database.\n"
UNREACHABLE = (
    "{prog}: error: '{value}' can't be reached now, or it is an invalid entry for --cluster."
    "  Use 'sacctmgr list clusters' to see available clusters.\n"
)


def run(capsys: pytest.CaptureFixture[str], main, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def submitted(api: FakeApi) -> int:
    return sum(1 for method, path, *_ in api.requests if (method, path) == ("POST", "/api/v1/jobs"))


def test_sbatch_names_the_cluster_it_submitted_to_when_asked_for_one(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(capsys, sbatch.main, "-M", "spur", "--parsable", "--wrap", "true") == (
        0,
        "100;spur\n",
        "",
    )
    assert run(capsys, sbatch.main, "--clusters=spur", "--wrap", "true") == (
        0,
        "Submitted batch job 101 on cluster spur\n",
        "",
    )
    assert run(capsys, sbatch.main, "-M", "all", "--parsable", "--wrap", "true")[1] == "102;spur\n"
    monkeypatch.setenv("SLURM_CLUSTERS", "spur")
    assert run(capsys, sbatch.main, "--parsable", "--wrap", "true")[1] == "103;spur\n"
    monkeypatch.delenv("SLURM_CLUSTERS")
    # Without -M, no cluster: nor is the API asked for its name.
    fake_api.requests.clear()
    assert run(capsys, sbatch.main, "--parsable", "--wrap", "true")[1] == "104\n"
    assert [path for _, path, *_ in fake_api.requests] == ["/api/v1/jobs"]


def test_sbatch_refuses_another_cluster_and_submits_nothing(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, sbatch.main, "-M", "nosuch,other", "--parsable", "--wrap", "true")
    assert (code, out) == (1, "")
    assert err == (
        UNKNOWN.format(prog="sbatch", name="nosuch")
        + UNKNOWN.format(prog="sbatch", name="other")
        + UNREACHABLE.format(prog="sbatch", value="nosuch,other")
    )
    assert submitted(fake_api) == 0
    # One of them ours: the others are named, the job goes to ours.
    code, out, err = run(capsys, sbatch.main, "-M", "spur,other", "--wrap", "true")
    assert (code, out, err) == (
        0,
        "Submitted batch job 100 on cluster spur\n",
        UNKNOWN.format(prog="sbatch", name="other"),
    )


def test_squeue_and_sinfo_head_their_table_with_the_cluster(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.queue = [job(3, "wrap", "PENDING")]
    fake_api.nodes, fake_api.partitions = nodes(), partitions()
    assert run(capsys, squeue.main, "-M", "spur", "-o", "%i,%T") == (
        0,
        "CLUSTER: spur\nJOBID,STATE\n3,PENDING\n",
        "",
    )
    assert run(capsys, squeue.main, "-M", "spur", "--noheader", "-o", "%i,%T") == (
        0,
        "3,PENDING\n",
        "",
    )
    code, out, err = run(capsys, squeue.main, "-M", "spur", "-j", "999999")
    assert (code, out, err) == (
        1,
        "CLUSTER: spur\n",
        "slurm_load_jobs error: Invalid job id specified\n",
    )
    assert run(capsys, sinfo.main, "-M", "all", "-N", "-o", "%N %t")[1] == (
        "CLUSTER: spur\nNODELIST STATE\ngpu01 idle\ngpu02 idle\ngpu03 idle\ngpu04 idle\n"
    )
    assert run(capsys, sinfo.main, "-M", "spur", "-h", "-o", "%P")[1] == "gpu*\n"


@pytest.mark.parametrize("main", [squeue.main, sinfo.main])
def test_squeue_and_sinfo_refuse_another_cluster(
    fake_api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    main,  # type: ignore[no-untyped-def]
) -> None:
    prog = "squeue" if main is squeue.main else "sinfo"
    assert run(capsys, main, "-M", "nosuch") == (
        1,
        "",
        UNKNOWN.format(prog=prog, name="nosuch") + UNREACHABLE.format(prog=prog, value="nosuch"),
    )


def test_scancel_acts_on_its_own_cluster_only(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.jobs[7] = {"job_id": 7, "state": "RUNNING"}
    assert run(capsys, scancel.main, "-M", "nosuch", "7") == (
        1,
        "",
        UNKNOWN.format(prog="scancel", name="nosuch")
        + UNREACHABLE.format(prog="scancel", value="nosuch"),
    )
    assert not any(path.endswith("/cancel") for _, path, *_ in fake_api.requests)
    assert run(capsys, scancel.main, "-M", "spur,nosuch", "7") == (
        0,
        "",
        UNKNOWN.format(prog="scancel", name="nosuch"),
    )
    assert any(path == "/api/v1/jobs/7/cancel" for _, path, *_ in fake_api.requests)


def test_sacct_takes_clusters_as_a_filter_as_slurms_database_does(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.history = [job(3, "wrap", "COMPLETED")]
    argv = ["-X", "-P", "-o", "JobID,State", "-j", "3"]
    assert run(capsys, sacct.main, "-M", "spur", *argv) == (0, "JobID|State\n3|COMPLETED\n", "")
    assert run(capsys, sacct.main, "-M", "spur,nosuch", *argv)[1] == "JobID|State\n3|COMPLETED\n"
    # No cluster of ours: silent, no rows, exit 0 (and the history is not read).
    fake_api.requests.clear()
    assert run(capsys, sacct.main, "-M", "nosuch", *argv) == (0, "JobID|State\n", "")
    assert [path for _, path, *_ in fake_api.requests] == ["/api/v1/config"]
