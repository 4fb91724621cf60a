"""scontrol, sprio, sshare and sacctmgr end to end: each command's own `run`, its
ApiClient speaking HTTP to the real web app (pytest-django's live server, on loopback),
which asks a real `spurctld`. What a user types, what they read back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from scheduler.cli import sacctmgr, scontrol, sprio, sshare
from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig
from spurcloud.tenants.services import create_api_token
from tests.spurcloud.conftest import Tenant

SCRIPT = "#!/bin/sh\nsleep 600\n"


@pytest.fixture
def cli(
    live_server: Any, acme: Tenant, live_controller: Any
) -> Callable[..., tuple[int, str, str]]:
    """Runs a command as acme's member (max) against the web app; (rc, stdout, stderr)."""
    _, secret = create_api_token(user=acme.member, organization=acme.organization, name="cli")
    config = CliConfig(api_url=live_server.url, token=secret, user="max")

    def run(module: Any, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        args = module.parse_args(list(argv), {})
        client = ApiClient(config)
        try:
            text = getattr(module, "offline", lambda a: None)(args)
            rc = 0 if text is not None else module.run(args, config, client)
        finally:
            client.close()
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def _submit(cli_run: Callable[..., Any], acme: Tenant, **spec: Any) -> int:
    from spurcloud.jobs.services import submit_job

    job = submit_job(organization=acme.organization, user=acme.member,
                     spec={"script": SCRIPT, **spec})  # fmt: skip
    return int(job["job_id"])


def test_scontrol_shows_holds_releases_and_updates_a_pending_job(
    cli: Callable[..., tuple[int, str, str]], acme: Tenant, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its begin time a day away: released, it still waits (the leader's pass after the
    # release would otherwise start it at once, and a running job cannot be held).
    job_id = _submit(cli, acme, name="first", hold=True, stdout="out-%j.txt", comment="hi",
                     begin_time=time.time() + 86400)  # fmt: skip
    rc, out, err = cli(scontrol, "show", "job", str(job_id), capsys=capsys)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"JobId={job_id} JobName=first"
    assert "   JobState=PENDING Reason=JobHeldUser Dependency=(null)" in lines
    assert any(
        line.startswith("   StdOut=") and line.endswith(f"/out-{job_id}.txt") for line in lines
    )
    assert "   Comment=hi " in lines
    assert out.endswith("   \n\n")

    rc, out, err = cli(scontrol, "update", f"JobId={job_id}", "TimeLimit=1:30:00", "JobName=second",
                       "Nice=7", capsys=capsys)  # fmt: skip
    assert (rc, out, err) == (0, "", "")
    rc, out, _ = cli(scontrol, "-o", "show", "job", str(job_id), capsys=capsys)
    assert out.count("\n") == 1
    assert f"JobId={job_id} JobName=second " in out
    assert " Nice=7 " in out and " TimeLimit=01:30:00 " in out

    assert cli(scontrol, "release", str(job_id), capsys=capsys)[:2] == (0, "")
    rc, out, _ = cli(scontrol, "show", "job", str(job_id), capsys=capsys)
    assert "Reason=JobHeldUser" not in out
    assert cli(scontrol, "hold", str(job_id), capsys=capsys)[:2] == (0, "")

    rc, out, err = cli(scontrol, "update", f"JobId={job_id}", "Nice=-5", capsys=capsys)
    assert rc == 1 and err.startswith("slurm_update error: nice: a negative nice")
    rc, out, err = cli(scontrol, "update", "JobId=999999", "Comment=x", capsys=capsys)
    assert (rc, err) == (1, "slurm_update error: Invalid job id specified\n")
    rc, out, err = cli(scontrol, "show", "job", "999999", capsys=capsys)
    assert (rc, out, err) == (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    rc, out, err = cli(scontrol, "hold", "999999", capsys=capsys)
    assert (rc, err) == (1, "Invalid job id specified for job 999999\n")


def test_scontrol_shows_nodes_partitions_config_and_pings(
    cli: Callable[..., tuple[int, str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = cli(scontrol, "show", "node", "node01", capsys=capsys)
    assert rc == 0 and out.startswith("NodeName=node01 Arch=(null) CoresPerSocket=")
    assert "   Gres=gpu:h100:1\n" in out and "   State=IDLE " in out
    rc, out, err = cli(scontrol, "show", "node", "node99", capsys=capsys)
    assert (rc, err) == (1, "Node node99 not found\n")
    rc, out, _ = cli(scontrol, "show", "partition", capsys=capsys)
    assert out.startswith("PartitionName=gpu\n") and "   Nodes=node01\n" in out
    assert "   State=UP TotalCPUs=16 TotalNodes=1 SelectTypeParameters=NONE\n" in out
    rc, out, _ = cli(scontrol, "show", "config", capsys=capsys)
    assert "MinJobAge               = 300 sec" in out.splitlines()
    assert "MaxArraySize            = 1001" in out.splitlines()
    assert cli(scontrol, "ping", capsys=capsys)[:2] == (
        0,
        "Slurmctld(primary) at spurctld0 is UP\n",
    )
    assert cli(scontrol, "show", "topology", capsys=capsys) == (0, "", "")


def test_sprio_sshare_and_sacctmgr_show_the_members_account(
    cli: Callable[..., tuple[int, str, str]], acme: Tenant, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = cli(sacctmgr, "-P", "show", "assoc", capsys=capsys)
    lines = out.splitlines()
    assert lines[0].startswith("Cluster|Account|User|Partition|Share|")
    assert [line.split("|")[1:3] for line in lines[1:]] == [["acme", ""], ["acme", "max"],
                                                             ["acme", "olivia"]]  # fmt: skip
    rc, out, _ = cli(sacctmgr, "-n", "-P", "show", "user", "where", "name=max", capsys=capsys)
    assert out == "max|acme|None\n"
    _submit(cli, acme, hold=True)  # the controller knows an account once it has a job
    rc, out, _ = cli(sshare, "-P", capsys=capsys)
    assert out.splitlines() == [
        "Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare",
        " acme||1|1.000000|0|0.000000|1.000000",
        "  acme|max|1|1.000000|0|0.000000|1.000000",
    ]
    rc, out, _ = cli(sprio, "-w", capsys=capsys)
    assert out.splitlines()[1].split() == ["Weights", "1000", "10000", "1000", "10000", "10000"]


def test_scontrol_suspend_and_resume_are_an_operators_with_slurms_messages(
    cli: Callable[..., tuple[int, str, str]],
    live_server: Any,
    acme: Tenant,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import time

    from scheduler.cli import squeue
    from spurcloud.tenants.services import add_member
    from tests.spurcloud.conftest import make_user

    running = _submit(cli, acme, gpus_per_node=1)
    waiting = _submit(cli, acme, gpus_per_node=1, hold=True)
    deadline = time.monotonic() + 10
    while cli(squeue, "-h", "-o", "%t", "-j", str(running), capsys=capsys)[1] != "R\n":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    # A tenant (here the job's own user) is no administrator.
    rc, out, err = cli(scontrol, "suspend", str(running), capsys=capsys)
    assert (rc, out, err) == (1, "", f"Access/permission denied for job {running}\n")

    staff = make_user("operator", staff=True)
    add_member(organization=acme.organization, user=staff)
    _, secret = create_api_token(
        user=staff, organization=acme.organization, name="ops", scopes={"read", "jobs", "admin"}
    )
    config = CliConfig(api_url=live_server.url, token=secret, user="operator")

    def operator(module: Any, *argv: str) -> tuple[int, str, str]:
        client = ApiClient(config)
        try:
            rc = module.run(module.parse_args(list(argv), {}), config, client)
        finally:
            client.close()
        out, err = capsys.readouterr()
        return rc, out, err

    assert operator(scontrol, "suspend", str(running)) == (0, "", "")
    assert operator(scontrol, "suspend", str(running)) == (0, "", "")  # again: no error
    rc, out, _ = operator(squeue, "-h", "-o", "%i %t %T", "-j", str(running))
    assert out == f"{running} S SUSPENDED\n"
    rc, out, _ = operator(scontrol, "show", "job", str(running))
    assert "   JobState=SUSPENDED Reason=None Dependency=(null)" in out.splitlines()
    assert "SuspendTime=None" not in out
    assert operator(scontrol, "resume", str(running)) == (0, "", "")
    assert operator(scontrol, "resume", str(running)) == (
        1,
        "",
        f"Job is not suspended for job {running}\n",
    )
    assert operator(scontrol, "suspend", str(waiting)) == (
        1,
        "",
        f"Job is pending execution for job {waiting}\n",
    )
    assert operator(scontrol, "resume", "999999") == (
        1,
        "",
        "Unexpected message received for job 999999\n",
    )
    rc, out, _ = operator(squeue, "-h", "-o", "%i %t", "-j", str(running))
    assert out == f"{running} R\n"
