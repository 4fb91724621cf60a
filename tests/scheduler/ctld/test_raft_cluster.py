"""Controller replicas as real `spurctld` processes on loopback: a follower that fell
behind a compacted log catches up from a snapshot; replicas join and leave the group at
runtime (`spur raft add|remove`); `spur ping` shows each replica's Raft view."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.client import ControllerClient
from tests.fixtures.controller import write_controller_config
from tests.fixtures.processes import BIN, Processes, free_port, wait_until
from tests.scheduler.core.factories import gpu_node, spec

TOKEN = "raft-cluster-token"
ENV = {"SPUR_RAFT_PASSWORD": "shared-secret", "SPUR_SIGNING_KEY": "shared-key"}


class Group:
    """Up to `size` replica slots, each with its own ports and state directory."""

    def __init__(self, tmp_path: Path, size: int, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp_path
        self.http = [free_port() for _ in range(size)]
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        self.env = {**ENV, **(env or {})}
        self.config = tmp_path / "spur.toml"
        write_controller_config(
            self.config, token=TOKEN, http_port=self.http[0],
            raft_port=int(self.raft[0].rsplit(":", 1)[1]), state_dir=tmp_path / "x",
            broker_url="filesystem://", broker_folder=tmp_path / "broker",
        )  # fmt: skip
        self.procs = Processes(tmp_path / "logs")
        self.clients = [
            ControllerClient([f"http://127.0.0.1:{p}"], TOKEN, timeout=15) for p in self.http
        ]

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.http[i]}"

    def start(self, i: int, peers: list[int]) -> None:
        self.procs.start(
            f"ctld{i}",
            [
                str(BIN / "spurctld"), "--config", str(self.config),
                "--listen", f"127.0.0.1:{self.http[i]}", "--raft-address", self.raft[i],
                "--raft-peers", ",".join(self.raft[j] for j in peers if j != i),
                "--state-dir", str(self.state_dir(i)),
            ],
            env=self.env,
        )  # fmt: skip

    def state_dir(self, i: int) -> Path:
        return self.tmp / f"ctld{i}"

    def stop(self, i: int, sig: int = signal.SIGTERM) -> None:
        self.procs.stop(f"ctld{i}", sig)

    def raft_info(self, i: int) -> dict[str, Any]:
        info: dict[str, Any] = self.clients[i].call("GET", "/v1/raft")["replica"]
        return info

    def leader(self, among: list[int]) -> int:
        for i in among:
            try:
                if self.raft_info(i)["role"] == "leader":
                    return i
            except Exception:
                continue
        return -1

    def wait_leader(self, among: list[int]) -> int:
        wait_until(lambda: self.leader(among) >= 0, timeout=30, what="a leader")
        return self.leader(among)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.procs.stop_all()


@pytest.fixture
def group(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    size, env = getattr(request, "param", (3, {}))
    g = Group(tmp_path, size, env)
    try:
        yield g
    finally:
        g.close()


def spur(*args: str, group: Group, urls: list[int]) -> subprocess.CompletedProcess[str]:
    controllers = ",".join(group.url(i) for i in urls)
    return subprocess.run(
        [str(BIN / "spur"), *args, "--config", str(group.config), "--controller", controllers],
        capture_output=True,
        text=True,
        timeout=60,
    )


def summary(client: ControllerClient) -> list[tuple[int, str, str]]:
    return sorted((j["job_id"], j["name"], j["state"]) for j in client.jobs())


@pytest.mark.parametrize("group", [(3, {"SPUR_RAFT_SNAPSHOT_ENTRIES": "40"})], indirect=True)
def test_a_follower_behind_a_compacted_log_catches_up_from_a_snapshot(group: Group) -> None:
    everyone = [0, 1, 2]
    for i in everyone:
        group.start(i, everyone)
    leader = group.wait_leader(everyone)
    client = group.clients[leader]
    client.register_node(gpu_node("sim01").to_dict())
    lagging = next(i for i in everyone if i != leader)
    wait_until(lambda: len(group.clients[lagging].nodes()) == 1, timeout=10, what="replication")
    behind_at = group.raft_info(lagging)["log_last_index"]
    group.stop(lagging)

    for n in range(150):
        client.submit(spec(name=f"j{n}").to_dict())
    # The survivors compacted their logs past everything the stopped follower holds:
    # the entries it misses exist only in a snapshot now.
    wait_until(
        lambda: group.raft_info(leader)["log_first_index"] > behind_at + 100,
        timeout=30,
        what="log compaction on the leader",
    )

    group.start(lagging, everyone)
    expected = summary(client)
    assert len(expected) == 150
    wait_until(
        lambda: summary(group.clients[lagging]) == summary(client),
        timeout=60,
        what="the follower to catch up",
    )
    info = group.raft_info(lagging)
    assert info["log_first_index"] > behind_at + 100  # its log starts after a snapshot
    assert info["last_applied"] >= info["log_first_index"]
    assert list(group.state_dir(lagging).glob("raft-*.dump"))
    # And it keeps up from the log afterwards.
    later = client.submit(spec(name="later").to_dict())["job_id"]
    wait_until(
        lambda: later in {j["job_id"] for j in group.clients[lagging].jobs()},
        timeout=30,
        what="replication after the snapshot",
    )


@pytest.mark.parametrize("group", [(3, {})], indirect=True)
def test_replicas_join_and_leave_the_group_at_runtime(group: Group) -> None:
    group.start(0, [0, 1])
    group.start(1, [0, 1])
    leader = group.wait_leader([0, 1])
    for method, path in (("GET", "/v1/raft"), ("POST", "/v1/raft/members")):
        response = httpx.request(method, group.url(0) + path, json={"address": "x:1"}, timeout=10)
        assert response.status_code == 401  # the cluster token, as every ctld route
    group.clients[leader].register_node(gpu_node("sim01").to_dict())
    first = group.clients[leader].submit(spec(name="before-join").to_dict())["job_id"]

    # A new replica starts with the members as its peers, then an operator adds it.
    group.start(2, [0, 1, 2])
    added = spur("raft", "add", group.raft[2], group=group, urls=[0, 1])
    assert added.returncode == 0, added.stderr
    assert sorted(group.raft[:3]) == sorted(added.stdout.split(": ", 1)[1].strip().split(", "))
    wait_until(
        lambda: first in {j["job_id"] for j in group.clients[2].jobs()},
        timeout=30,
        what="the new replica to catch up",
    )
    for i in (0, 1, 2):
        wait_until(
            lambda i=i: len(group.raft_info(i)["members"]) == 3, timeout=15, what="3 members"
        )

    # Adding it twice is refused; so is an address that is not HOST:PORT.
    again = spur("raft", "add", group.raft[2], group=group, urls=[0])
    assert again.returncode == 1 and "already a member" in again.stderr
    bad = spur("raft", "add", "no-port", group=group, urls=[0])
    assert bad.returncode == 1 and "HOST:PORT" in bad.stderr

    # Remove a follower of the first two, then stop it: the other two are the group now,
    # and they commit without it (2 of 2, where 2 of 3 would not have been a majority
    # had the third been down instead).
    leader = group.wait_leader([0, 1, 2])
    gone = next(i for i in (0, 1) if i != leader)
    refused = spur("raft", "remove", group.raft[leader], group=group, urls=[leader])
    assert refused.returncode == 1 and "is the leader" in refused.stderr
    removed = spur("raft", "remove", group.raft[gone], group=group, urls=[leader])
    assert removed.returncode == 0, removed.stderr
    group.stop(gone, signal.SIGKILL)
    stay = [i for i in (0, 1, 2) if i != gone]
    for i in stay:
        wait_until(
            lambda i=i: group.raft_info(i)["members"] == sorted(group.raft[j] for j in stay),
            timeout=15,
            what="the member to be gone",
        )
    other = next(i for i in stay if i != leader)
    group.stop(other, signal.SIGKILL)  # and with one of the two down, no majority:
    leader_client = ControllerClient([group.url(leader)], TOKEN, timeout=3)
    with leader_client, pytest.raises(Exception):  # noqa: B017 (503 or a timeout)
        leader_client.submit(spec(name="no-majority").to_dict())
    group.start(other, [0, 1, 2])
    later = group.clients[leader].submit(spec(name="after-leave").to_dict())["job_id"]
    wait_until(
        lambda: later in {j["job_id"] for j in group.clients[other].jobs()},
        timeout=30,
        what="replication in the smaller group",
    )

    # spur ping: every reachable replica, its role and term; exactly one leader.
    pinged = spur("ping", "--json", group=group, urls=[0, 1, 2])
    rows = json.loads(pinged.stdout)
    assert pinged.returncode == 0, pinged.stderr
    by_url = {r["url"]: r for r in rows}
    assert "error" in by_url[group.url(gone)]
    live = [by_url[group.url(i)] for i in stay]
    assert sorted(r["role"] for r in live) == ["follower", "leader"]
    assert len({r["term"] for r in live}) == 1
    assert all(r["commit_index"] >= r["log_first_index"] for r in live)
    table = spur("ping", group=group, urls=stay)
    assert table.returncode == 0
    assert "ROLE" in table.stdout and "leader" in table.stdout and "follower" in table.stdout
