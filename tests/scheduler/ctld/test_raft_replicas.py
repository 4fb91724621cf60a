"""Three controller replicas in one Raft group, as real processes."""

from __future__ import annotations

import signal
import time

import pytest

from scheduler.client import ControllerClient
from tests.fixtures.controller import write_controller_config
from tests.fixtures.processes import BIN, Processes, free_port, wait_until
from tests.scheduler.core.factories import gpu_node, spec


@pytest.fixture
def replicas(tmp_path):
    token = "raft-test-token"
    http = [free_port() for _ in range(3)]
    raft = [free_port() for _ in range(3)]
    config = tmp_path / "spur.toml"
    write_controller_config(
        config,
        token=token,
        http_port=http[0],
        raft_port=raft[0],
        state_dir=tmp_path / "x",
        broker_url="filesystem://",
        broker_folder=tmp_path / "broker",
    )
    procs = Processes(tmp_path / "logs")

    def start(i: int) -> None:
        peers = ",".join(f"127.0.0.1:{p}" for j, p in enumerate(raft) if j != i)
        procs.start(
            f"ctld{i}",
            [
                str(BIN / "spurctld"),
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{http[i]}",
                "--raft-address",
                f"127.0.0.1:{raft[i]}",
                "--raft-peers",
                peers,
                "--state-dir",
                str(tmp_path / f"ctld{i}"),
            ],
            env={"SPUR_RAFT_PASSWORD": "shared-secret", "SPUR_SIGNING_KEY": "shared-key"},
        )

    for i in range(3):
        start(i)
    clients = [ControllerClient([f"http://127.0.0.1:{p}"], token, timeout=15) for p in http]
    wait_until(lambda: sum(c.ping()["leader"] for c in clients) == 1, timeout=30, what="one leader")
    try:
        yield procs, clients, start
    finally:
        for c in clients:
            c.close()
        procs.stop_all()


def leader_index(clients) -> int:
    for i, client in enumerate(clients):
        try:
            if client.ping()["leader"]:
                return i
        except Exception:
            continue
    return -1


def test_a_follower_forwards_writes_and_every_replica_sees_them(replicas):
    procs, clients, _ = replicas
    follower = next(c for c in clients if not c.ping()["leader"])
    follower.register_node(gpu_node("sim01").to_dict())
    job_id = follower.submit(spec(name="via-follower").to_dict())["job_id"]
    for client in clients:
        wait_until(
            lambda c=client: [j["name"] for j in c.jobs()] == ["via-follower"],
            timeout=10,
            what="replication",
        )
    assert clients[leader_index(clients)].job(job_id)["name"] == "via-follower"


def test_losing_the_leader_elects_another_that_keeps_every_job(replicas):
    procs, clients, start = replicas
    clients[0].register_node(gpu_node("sim01").to_dict())
    ids = [clients[0].submit(spec(name=f"j{i}").to_dict())["job_id"] for i in range(5)]
    old = leader_index(clients)
    procs.stop(f"ctld{old}", signal.SIGKILL)
    survivors = [c for i, c in enumerate(clients) if i != old]
    wait_until(lambda: leader_index(survivors) >= 0, timeout=30, what="a new leader")
    new = survivors[leader_index(survivors)]
    assert sorted(j["job_id"] for j in new.jobs()) == ids
    later = new.submit(spec(name="after-failover").to_dict())["job_id"]
    assert later == ids[-1] + 1
    start(old)  # the old leader comes back as a follower and catches up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if later in {j["job_id"] for j in clients[old].jobs()}:
                break
        except Exception:
            pass
        time.sleep(0.1)
    assert later in {j["job_id"] for j in clients[old].jobs()}
