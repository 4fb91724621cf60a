"""What a controller replica exposes on the network, and what its journal survives: a lone
replica opens no Raft port, a group binds its configured address only and needs a
password, and a journal holding a command that fails replays on."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from scheduler.core import commands as c
from scheduler.core.errors import Rejected
from scheduler.ctld.replica import InsecureGroup, Replica
from tests.fixtures.controller import RunningController, write_controller_config
from tests.fixtures.processes import BIN, free_port, wait_until
from tests.scheduler.core.factories import gpu_node, spec


def listening_on(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on `port` (from /proc/net/tcp*)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_a_lone_replica_opens_no_raft_port(controller: RunningController) -> None:
    raft_port = int(raft_address(controller).rsplit(":", 1)[1])
    assert listening_on(raft_port) == set()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", raft_port), timeout=1):
        pass
    with controller.client() as client:  # and it still commits: it leads alone
        client.register_node(gpu_node("n1").to_dict())
        assert client.submit(spec().to_dict())["job_id"] == 1


def test_a_replica_of_a_group_binds_its_own_address_only(tmp_path: Path) -> None:
    port = free_port()
    replica = Replica(
        address=f"127.0.0.1:{port}",
        peers=[f"127.0.0.1:{free_port()}"],
        state_dir=str(tmp_path),
        password="secret",
        on_effects=lambda command, effects: None,
        on_leader_change=lambda leading: None,
    )
    try:
        wait_until(lambda: bool(listening_on(port)), timeout=10, what="the raft port")
        assert listening_on(port) == {"0100007F"}  # 127.0.0.1, not 0.0.0.0
    finally:
        replica.destroy()


def test_a_group_without_a_password_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(InsecureGroup, match="raft_password"):
        Replica(
            address=f"127.0.0.1:{free_port()}",
            peers=[f"127.0.0.1:{free_port()}"],
            state_dir=str(tmp_path),
            on_effects=lambda command, effects: None,
            on_leader_change=lambda leading: None,
        )
    config = tmp_path / "spur.toml"
    write_controller_config(
        config, token="t", http_port=free_port(), raft_port=free_port(), state_dir=tmp_path,
        broker_url="filesystem://", broker_folder=tmp_path / "broker",
    )  # fmt: skip
    result = subprocess.run(
        [str(BIN / "spurctld"), "--config", str(config), "--raft-peers", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "SPUR_SIGNING_KEY": "k"},
    )
    assert result.returncode == 2
    assert "needs raft_password" in result.stderr


def test_a_journal_holding_a_command_that_fails_replays_on(
    controller: RunningController,
) -> None:
    # A command today's edge refuses (a spec the checks never let through) can still be
    # in a journal, written before those checks existed: it must not stop the replay.
    bad = spec()
    object.__setattr__(bad, "nodes", 0)  # the request would divide by zero
    with controller.client() as client:
        client.register_node(gpu_node("n1").to_dict())
        before = client.submit(spec(name="before").to_dict())["job_id"]
    controller.stop()
    replica = Replica(
        address=raft_address(controller),
        peers=[],
        state_dir=str(controller.state_dir),
        on_effects=lambda command, effects: None,
        on_leader_change=lambda leading: None,
    )
    try:
        wait_until(lambda: replica.is_leader, timeout=10, what="the replica to lead")
        with pytest.raises(Rejected) as refused:
            replica.commit(c.SubmitJob("poison", time.time(), bad))
        assert refused.value.code == "internal"
        after = replica.commit(c.SubmitJob("after", time.time(), spec(name="after")))
    finally:
        replica.destroy()
    controller.start()  # replays the journal, the refused entry included
    with controller.client() as client:
        names = {j["job_id"]: j["name"] for j in client.jobs()}
        assert names == {before: "before", after: "after"}
        assert client.submit(spec(name="later").to_dict())["job_id"] == after + 1


def raft_address(controller: RunningController) -> str:
    return next(
        line.split('"')[1]
        for line in controller.config_path.read_text().splitlines()
        if line.startswith("raft_address")
    )
