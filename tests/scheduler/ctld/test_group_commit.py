"""Group commit: commands that arrive while a Raft round is in flight share the next log
entry, and each caller still gets its own outcome, in order."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from scheduler.core import commands as c
from scheduler.core.errors import Rejected
from scheduler.core.state import ClusterState
from scheduler.ctld.groupcommit import GroupCommit, Outcome
from scheduler.ctld.replica import Replica
from tests.scheduler.core.factories import cmd_id, gpu_node, spec


class Log:
    """A log that applies each entry to a real ClusterState, as a replica does, and
    takes `round_s` a round (a Raft round trip)."""

    def __init__(self, round_s: float = 0.02) -> None:
        self.state = ClusterState()
        self.entries: list[c.Command] = []
        self.round_s = round_s
        self.fail_next = False
        self.state.apply(
            c.ConfigurePartitions(cmd_id(), 1000.0, (c.PartitionDef("gpu", default=True),))
        )
        self.state.apply(c.RegisterNode(cmd_id(), 1000.0, gpu_node("n1")))

    def propose(self, entry: c.Command) -> list[Outcome]:
        time.sleep(self.round_s)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("no leader")
        self.entries.append(entry)
        commands = entry.commands if isinstance(entry, c.Batch) else (entry,)
        outcomes: list[Outcome] = []
        for command, result in zip(commands, self.state.apply_each(commands), strict=True):
            if isinstance(result, Rejected):
                outcomes.append(("rejected", result.message, result.code))
            elif isinstance(command, c.SubmitJob):
                outcomes.append(("ok", self.state.submissions[command.cmd_id], ""))
            else:
                outcomes.append(("ok", None, ""))
        return outcomes


def submit(name: str, **kw: object) -> c.SubmitJob:
    return c.SubmitJob(cmd_id(), 1001.0, spec(name=name, **kw))


def test_commands_waiting_together_share_a_log_entry_each_with_its_own_result() -> None:
    log = Log()
    group = GroupCommit(log.propose)
    results: dict[int, Outcome] = {}

    def client(i: int) -> None:
        results[i] = group.commit(submit(f"job{i}"), timeout=10)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    group.stop()
    assert group.committed == 40
    assert group.rounds < 40  # several commands a round
    assert any(isinstance(entry, c.Batch) for entry in log.entries)
    # Each caller got its own job, and the job is the one its command named.
    job_ids = {i: outcome[1] for i, outcome in results.items()}
    assert sorted(job_ids.values()) == list(range(1, 41))
    for i, job_id in job_ids.items():
        assert log.state.jobs[job_id].spec.name == f"job{i}"


def test_a_batch_applies_in_the_order_its_commands_arrived() -> None:
    log = Log(round_s=0.05)
    group = GroupCommit(log.propose)
    first = submit("first")
    outcomes = group.commit_all([first, *[submit(f"n{i}") for i in range(5)]], timeout=10)
    group.stop()
    assert [o[1] for o in outcomes] == [1, 2, 3, 4, 5, 6]
    assert [log.state.jobs[i].spec.name for i in range(1, 7)] == [
        "first", "n0", "n1", "n2", "n3", "n4"
    ]  # fmt: skip


def test_a_refused_command_changes_nothing_and_refuses_none_of_its_neighbours() -> None:
    log = Log()
    group = GroupCommit(log.propose)
    before = log.state.to_bytes()
    good = submit("ok")
    bad = c.CancelJob(cmd_id(), 1001.0, 999)  # no such job
    too_big = submit("big", gpus_per_node=64)  # more GPUs than the node has
    outcomes = group.commit_all([bad, good, too_big], timeout=10)
    group.stop()
    assert [o[0] for o in outcomes] == ["rejected", "ok", "rejected"]
    assert outcomes[1][1] == 1
    assert "Invalid job id" in outcomes[0][1]
    assert len(log.entries) == 1 and isinstance(log.entries[0], c.Batch)
    # Only the good one changed the state: a log without the refused ones ends the same.
    replay = Log()
    assert replay.state.to_bytes() == before
    replay.state.apply(good)
    assert replay.state.to_bytes() == log.state.to_bytes()


def test_an_entry_that_cannot_commit_fails_its_waiters_and_the_next_one_commits() -> None:
    log = Log()
    group = GroupCommit(log.propose)
    log.fail_next = True
    with pytest.raises(RuntimeError, match="no leader"):
        group.commit(submit("lost"), timeout=10)
    assert group.commit(submit("next"), timeout=10) == ("ok", 1, "")
    group.stop()


def test_a_caller_stops_waiting_at_its_timeout() -> None:
    log = Log(round_s=0.5)
    group = GroupCommit(log.propose)
    with pytest.raises(TimeoutError):
        group.commit(submit("slow"), timeout=0.05)
    group.stop()


def test_a_lone_replica_commits_concurrent_submissions_in_shared_rounds(tmp_path: Path) -> None:
    """The real thing: a Raft replica (pysyncobj, its journal fsynced) behind the group
    commit; concurrent callers each get their own job id, and replay gives the same
    state."""
    replica = Replica(
        address="127.0.0.1:0",
        peers=[],
        state_dir=str(tmp_path),
        on_effects=lambda command, effects: None,
        on_leader_change=lambda leading: None,
    )
    try:
        deadline = time.monotonic() + 10
        while not (replica.is_ready and replica.is_leader) and time.monotonic() < deadline:
            time.sleep(0.05)
        replica.commit(
            c.ConfigurePartitions(cmd_id(), 1000.0, (c.PartitionDef("gpu", default=True),))
        )
        replica.commit(c.RegisterNode(cmd_id(), 1000.0, gpu_node("n1")))
        ids: list[int] = []
        lock = threading.Lock()

        def client(i: int) -> None:
            for k in range(10):
                job_id = replica.commit(submit(f"c{i}-{k}"))
                with lock:
                    ids.append(job_id)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(ids) == list(range(1, 161))
        results = replica.commit_all([c.CancelJob(cmd_id(), 1002.0, 999), submit("after")])
        assert isinstance(results[0], Rejected) and results[1] == 161
        with replica.lock:
            names = {job.spec.name for job in replica.state.jobs.values()}
        assert len(names) == 161
    finally:
        replica.destroy()
