"""Node liveness and fencing, with real controllers and real agents (spurd) as processes:
heartbeats reach the leader, a new leader gives every node a full timeout, and a paused
agent's jobs are dead before the controller gives their GPUs to anyone else."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.jobprocess import process_start_time, still_running
from scheduler.client import ControllerClient
from scheduler.config import ConfigError, parse
from scheduler.ctld.controller import NOT_LEADER
from scheduler.rpc.errors import Unavailable
from tests.agents.spurd import Courier, reachable_dir, start_agent
from tests.fixtures.controller import RunningController, write_controller_config
from tests.fixtures.processes import BIN, Processes, free_port, wait_until
from tests.scheduler.core.factories import gpu_node, spec

TOKEN = "liveness-test-token"
NODE_TIMEOUT_S = 6.0  # heartbeats every 1 s, a lease of 3 s, 1 s to kill a fenced job
# Fencing: heartbeats every 1.5 s, a lease of 4.5 s, 1.5 s to kill (3 s spare on a busy
# machine, where the kill takes longer than the margin the config assumes).
FENCING_TIMEOUT_S = 9.0


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path / "logs")
    try:
        yield procs
    finally:
        for proc in procs.procs.values():  # a paused agent would never stop
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
        procs.stop_all()


@pytest.fixture
def work_root() -> Iterator[Path]:
    path = reachable_dir()
    yield path / "work"
    shutil.rmtree(path, ignore_errors=True)


def node_state(client: ControllerClient, name: str) -> str:
    [node] = [n for n in client.nodes() if n["name"] == name]
    return str(node["state"])


def leader_of(clients: list[ControllerClient]) -> int:
    for i, client in enumerate(clients):
        with contextlib.suppress(Exception):
            if client.ping()["leader"]:
                return i
    return -1


def stays_up(clients: list[ControllerClient], name: str, seconds: float) -> list[str]:
    """The states the node showed on the leader, every 0.2 s for `seconds`."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        leader = leader_of(clients)
        if leader >= 0:
            with contextlib.suppress(Exception):
                seen.append(node_state(clients[leader], name))
        time.sleep(0.2)
    return seen


# -- the lease and node_timeout inequality --------------------------------------------------


def test_node_timeout_must_outlast_the_lease_and_the_margin_to_kill() -> None:
    def controller(**values: float) -> dict[str, Any]:
        return {"cluster": {"token": "t"}, "controller": values}

    ctl = parse(controller(node_timeout_s=30)).controller
    assert (ctl.lease_s, ctl.fence_margin_s, ctl.heartbeat_interval_s) == (15, 5, 5)
    assert parse(controller(node_timeout_s=30, lease_s=20, fence_margin_s=9.5)).controller
    with pytest.raises(ConfigError, match="must be longer than"):
        parse(controller(node_timeout_s=30, lease_s=25))  # 25 + 5 is not < 30
    with pytest.raises(ConfigError, match="must be longer than"):
        parse(controller(node_timeout_s=30, fence_margin_s=15))
    with pytest.raises(ConfigError, match="two heartbeats"):
        parse(controller(node_timeout_s=30, lease_s=6))  # heartbeats every 5 s


# -- heartbeats reach the leader --------------------------------------------------------------


@pytest.fixture
def replicas(tmp_path: Path, procs: Processes) -> Iterator[list[ControllerClient]]:
    http = [free_port() for _ in range(3)]
    raft = [free_port() for _ in range(3)]
    config = tmp_path / "spur.toml"
    write_controller_config(
        config,
        token=TOKEN,
        http_port=http[0],
        raft_port=raft[0],
        state_dir=tmp_path / "x",
        broker_url="filesystem://",
        broker_folder=tmp_path / "broker",
        node_timeout_s=NODE_TIMEOUT_S,
    )
    for i in range(3):
        peers = ",".join(f"127.0.0.1:{p}" for j, p in enumerate(raft) if j != i)
        procs.start(
            f"ctld{i}",
            [str(BIN / "spurctld"), "--config", str(config), "--listen", f"127.0.0.1:{http[i]}",
             "--raft-address", f"127.0.0.1:{raft[i]}", "--raft-peers", peers,
             "--state-dir", str(tmp_path / f"ctld{i}")],
            env={"SPUR_RAFT_PASSWORD": "shared-secret", "SPUR_SIGNING_KEY": "shared-key"},
        )  # fmt: skip
    clients = [ControllerClient([f"http://127.0.0.1:{p}"], TOKEN, timeout=5) for p in http]
    wait_until(lambda: leader_of(clients) >= 0, timeout=30, what="a leader")
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def test_a_follower_turns_heartbeats_away_to_the_leader(replicas: list[ControllerClient]) -> None:
    leader = leader_of(replicas)
    follower = replicas[(leader + 1) % 3]
    follower.register_node(gpu_node("n9").to_dict())
    with pytest.raises(Unavailable) as refused:
        follower.heartbeat("n9", [])
    assert refused.value.code == NOT_LEADER
    assert "lease_s" in replicas[leader].heartbeat("n9", [])


def test_healthy_agents_stay_up_across_a_failover(
    tmp_path: Path, procs: Processes, replicas: list[ControllerClient], work_root: Path
) -> None:
    # The fault: the agent kept heartbeating whichever replica had answered last (here
    # a follower, listed first), whose clock nobody reads: the leader marked the node
    # down; and a new leader kept its stale clocks, and marked it down within seconds.
    leader = leader_of(replicas)
    order = [(leader + 1) % 3, (leader + 2) % 3, leader]
    urls = [replicas[i].urls[0] for i in order]
    start_agent(tmp_path, procs, name="sim01", token=TOKEN, controllers=urls, work_root=work_root)
    before = stays_up(replicas, "sim01", 2 * NODE_TIMEOUT_S)
    assert before and set(before) == {"idle"}, before
    procs.stop(f"ctld{leader}", signal.SIGKILL)
    survivors = [c for i, c in enumerate(replicas) if i != leader]
    wait_until(lambda: leader_of(survivors) >= 0, timeout=30, what="a new leader")
    after = stays_up(survivors, "sim01", 2 * NODE_TIMEOUT_S)
    assert after and set(after) == {"idle"}, after


# -- fencing: a paused agent's jobs die before their GPUs are given away ------------------


@pytest.fixture
def controller(tmp_path: Path, procs: Processes) -> RunningController:
    config = tmp_path / "spur.toml"
    write_controller_config(
        config,
        token=TOKEN,
        http_port=(port := free_port()),
        raft_port=free_port(),
        state_dir=tmp_path / "ctld",
        broker_url="filesystem://",
        broker_folder=tmp_path / "broker",
        node_timeout_s=FENCING_TIMEOUT_S,
    )
    running = RunningController(f"http://127.0.0.1:{port}", TOKEN, config, tmp_path / "ctld", procs)
    running.start()
    return running


def test_a_paused_agents_jobs_are_dead_before_their_gpus_are_freed(
    tmp_path: Path, procs: Processes, controller: RunningController, work_root: Path
) -> None:
    # The fault: an agent alive but cut off (here: stopped, SIGSTOP) kept its jobs
    # running on GPUs the controller had given to others.
    agent = start_agent(
        tmp_path, procs, name="sim01", token=TOKEN, controllers=[controller.url],
        work_root=work_root,
    )  # fmt: skip
    courier = Courier(tmp_path / "broker", TOKEN)
    with controller.client() as client:
        job_id = client.submit(
            spec(script="#!/bin/bash\nexec sleep 7373\n", gpus_per_node=8).to_dict()
        )["job_id"]
        courier.deliver(job_id)
        wait_until(lambda: client.job(job_id)["pid"] is not None, timeout=30, what="started")
        init = agent.job_init(job_id)
        start = process_start_time(init)
        agent.pause()
        paused = time.monotonic()
        gone = freed = None
        while time.monotonic() - paused < 4 * FENCING_TIMEOUT_S and freed is None:
            if gone is None and not still_running(init, start):
                gone = time.monotonic() - paused
            job = client.job(job_id)
            if job["state"] != "RUNNING":
                freed = time.monotonic() - paused
                assert job["state"] == "NODE_FAIL"
            time.sleep(0.05)
        assert freed is not None, "the controller never gave the node up"
        assert gone is not None and gone < freed, (gone, freed)
        assert gone < 4.5 + 1.5 + 1.5  # the lease, the margin, slack for a busy machine
        assert freed >= FENCING_TIMEOUT_S - 2.0  # the last heartbeat came at most 1.5 s before
        # Back, the agent's node is up again, and its late report of the fenced job
        # changes nothing.
        agent.resume()
        wait_until(lambda: node_state(client, "sim01") == "idle", timeout=30, what="node up")
        assert client.job(job_id)["state"] == "NODE_FAIL"


def test_a_heartbeat_moves_past_a_replica_that_accepts_and_never_answers(
    controller: RunningController,
) -> None:
    # A paused (SIGSTOPped) replica: the kernel completes the connection, nobody reads.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    client = ControllerClient(
        [f"http://127.0.0.1:{silent.getsockname()[1]}", controller.url], controller.token
    )
    node = gpu_node("hb01", gpus=1)
    try:
        client.register_node(node.to_dict())
        started = time.monotonic()
        answer = client.heartbeat("hb01", [], timeout_s=1.0)
        # On to the leader after one second, not after the client's 10 s default (which
        # is longer than a node timeout: the node would have been marked down).
        assert time.monotonic() - started < 5.0
        assert answer["registered"] is True
    finally:
        client.close()
        silent.close()
