"""`spurcloud up` refuses, saying what to do, to start a platform whose jobs could not
run; and writes the agents' settings for the user it runs as."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from spurcloud.stack import Stack, check_sandbox

pytestmark = pytest.mark.e2e


def test_up_refuses_without_bubblewrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"bubblewrap \(bwrap\) is not installed"):
        Stack(state_dir=tmp_path / "spur").prepare()
    assert not (tmp_path / "spur").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's jobs change identity")
def test_up_as_root_refuses_a_work_root_the_jobs_cannot_reach(tmp_path: Path) -> None:
    # pytest's temporary directories are 0700: an organisation's account cannot pass.
    with pytest.raises(RuntimeError, match="--work-root"):
        check_sandbox(tmp_path / "work")


@pytest.mark.parametrize("euid, personal", [(0, False), (1000, True)])
def test_up_writes_personal_mode_for_a_normal_user_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, euid: int, personal: bool
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    stack = Stack(state_dir=tmp_path, nodes=[("sim01", "h100-8")], work_root=Path("/srv/w"))
    stack.env = {"CELERY_BROKER_URL": "filesystem://", "CELERY_BROKER_FOLDER": "/b",
                 "SPUR_CLUSTER_NAME": "spur"}  # fmt: skip
    stack._write_config("token")
    config = (tmp_path / "spur.toml").read_text()
    assert 'work_root = "/srv/w"' in config
    assert ("personal = true" in config) is personal


def test_up_keeps_its_secrets_to_itself(tmp_path: Path) -> None:
    state = tmp_path / "spur"
    work = Path(tempfile.mkdtemp(prefix="spur-tests-", dir="/tmp"))  # passable by all
    work.chmod(0o711)
    Stack(state_dir=state, nodes=[("sim01", "h100-8")], work_root=work).prepare()
    assert state.stat().st_mode & 0o777 == 0o711  # passable (the work root), not listable
    for secret in ("cluster-token", "secret-key"):
        assert (state / secret).stat().st_mode & 0o777 == 0o600, secret
    # Run again, the same secrets are kept.
    token = (state / "cluster-token").read_text()
    Stack(state_dir=state, nodes=[("sim01", "h100-8")], work_root=work).prepare()
    shutil.rmtree(work)
    assert (state / "cluster-token").read_text() == token


def test_a_stack_of_three_controllers_writes_one_group_they_all_read(tmp_path: Path) -> None:
    """bench/e2e.py --replicas 3: the agents and the web know every replica, and each
    replica knows where the others answer (leader hints); the group's secrets are shared."""
    from scheduler.config import load

    work = Path(tempfile.mkdtemp(prefix="spur-tests-", dir="/tmp"))
    work.chmod(0o711)
    more = [(7002, 7102), (7003, 7103)]
    stack = Stack(state_dir=tmp_path / "spur", nodes=[("sim01", "h100-8")], work_root=work,
                  ctld_port=7001, raft_port=7101, more_controllers=more)  # fmt: skip
    stack.prepare()
    urls = [f"http://127.0.0.1:{p}" for p in (7001, 7002, 7003)]
    assert stack.env["SPUR_CONTROLLER_URLS"] == ",".join(urls)
    assert stack.env["SPUR_RAFT_PASSWORD"] and stack.env["SPUR_SIGNING_KEY"]
    config = load(stack.state_dir / "spur.toml", env=stack.env)
    assert list(config.agent.controllers) == urls
    assert dict(config.controller.raft_http) == {
        f"127.0.0.1:{raft}": f"http://127.0.0.1:{http}"
        for http, raft in ((7001, 7101), (7002, 7102), (7003, 7103))
    }


def test_up_gives_each_agent_its_own_ssh_port_unless_told_not_to(tmp_path: Path) -> None:
    nodes = [("sim01", "h100-8"), ("sim02", "mi300x-8")]
    stack = Stack(state_dir=tmp_path, nodes=nodes, ssh_base_port=3300)
    assert stack._ssh_ports() == [3300, 3301]
    assert "sim01 3300, sim02 3301" in stack.ssh_line()
    started: dict[str, list[str]] = {}
    stack.start = lambda name, argv: started.__setitem__(name, argv)  # type: ignore[method-assign]
    stack.start_all()
    assert started["spurd-sim01"][-3:-1] == ["--ssh-listen", "127.0.0.1:3300"]
    assert "127.0.0.1:3301" in started["spurd-sim02"]
    off = Stack(state_dir=tmp_path, nodes=nodes, ssh_base_port=0)
    assert off._ssh_ports() == [] and off.ssh_line() == ""
    started.clear()
    off.start = lambda name, argv: started.__setitem__(name, argv)  # type: ignore[method-assign]
    off.start_all()
    assert "--ssh-listen" not in started["spurd-sim01"]


def test_up_says_what_to_install_when_sftp_cannot_be_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agents import ssh_transfer

    stack = Stack(state_dir=tmp_path, nodes=[("sim01", "h100-8")])
    assert "sftp, scp and rsync -e ssh copy files" in stack.ssh_line()
    monkeypatch.setattr(ssh_transfer, "SFTP_SERVERS", ("/usr/lib/nothing/sftp-server",))
    said = stack.ssh_line()
    assert "WARNING: SFTP (sftp, and scp, which uses it) is not offered" in said
    assert "apt-get install openssh-sftp-server" in said
    assert "sim01 2222" in said  # SSH itself is still offered
