"""Group commit: commands that arrive while a Raft round is in flight share the next log
entry, and each caller still gets its own outcome, in order."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler.core import commands as c
from scheduler.core.errors import Rejected
from scheduler.core.state import ClusterState
from scheduler.ctld.groupcommit import Done, GroupCommit, Outcome, blocking
from scheduler.ctld.replica import Replica, Submitted
from tests.fixtures.processes import free_port
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
    group = GroupCommit(blocking(log.propose))
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
    group = GroupCommit(blocking(log.propose))
    first = submit("first")
    outcomes = group.commit_all([first, *[submit(f"n{i}") for i in range(5)]], timeout=10)
    group.stop()
    assert [o[1] for o in outcomes] == [1, 2, 3, 4, 5, 6]
    assert [log.state.jobs[i].spec.name for i in range(1, 7)] == [
        "first", "n0", "n1", "n2", "n3", "n4"
    ]  # fmt: skip


def test_a_refused_command_changes_nothing_and_refuses_none_of_its_neighbours() -> None:
    log = Log()
    group = GroupCommit(blocking(log.propose))
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
    group = GroupCommit(blocking(log.propose))
    log.fail_next = True
    with pytest.raises(RuntimeError, match="no leader"):
        group.commit(submit("lost"), timeout=10)
    assert group.commit(submit("next"), timeout=10) == ("ok", 1, "")
    group.stop()


def test_a_caller_stops_waiting_at_its_timeout() -> None:
    log = Log(round_s=0.5)
    group = GroupCommit(blocking(log.propose))
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


class PipelinedLog(Log):
    """A log whose proposals return at once and commit in the order they were made, one
    round after another on a thread of its own (as Raft commits entries in log order),
    counting how many were in flight together."""

    def __init__(self, round_s: float = 0.02) -> None:
        super().__init__(round_s)
        self._pending: queue.Queue[tuple[c.Command, Done]] = queue.Queue()
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._commit, daemon=True).start()

    def start(self, entry: c.Command, done: Done) -> None:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self._pending.put((entry, done))

    def _commit(self) -> None:
        while True:
            entry, done = self._pending.get()
            outcomes = self.propose(entry)
            with self._lock:
                self.in_flight -= 1
            done(outcomes, None)


def test_two_entries_in_flight_commit_in_the_order_their_commands_queued() -> None:
    log = PipelinedLog(round_s=0.02)
    group = GroupCommit(log.start, max_batch=1, max_in_flight=2)
    results: list[Outcome] = []

    def client() -> None:
        results.extend(group.commit_all([submit(f"n{i}") for i in range(6)], timeout=10))

    thread = threading.Thread(target=client)
    thread.start()
    thread.join()
    group.stop()
    assert log.most_in_flight == 2  # the next entry travelled while one was committing
    assert [o[1] for o in results] == [1, 2, 3, 4, 5, 6]
    assert [log.state.jobs[i].spec.name for i in range(1, 7)] == [f"n{i}" for i in range(6)]


def test_an_event_loop_awaits_its_commits_each_with_its_own_outcome() -> None:
    log = PipelinedLog(round_s=0.01)
    group = GroupCommit(log.start)

    async def clients() -> list[list[Outcome]]:
        bad = c.CancelJob(cmd_id(), 1001.0, 999)
        calls = [group.commit_all_async([submit(f"a{i}"), bad], timeout=10) for i in range(20)]
        return list(await asyncio.gather(*calls))

    answers = asyncio.run(clients())
    group.stop()
    assert sorted(a[0][1] for a in answers) == list(range(1, 21))
    assert all(a[1][0] == "rejected" for a in answers)
    assert group.rounds < 20  # the loop's commands shared entries too


def test_an_event_loop_caller_stops_waiting_at_its_timeout() -> None:
    log = PipelinedLog(round_s=0.5)
    group = GroupCommit(log.start)

    async def slow() -> None:
        await group.commit_async(submit("slow"), timeout=0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(slow())
    group.stop()


def test_an_event_loop_caller_of_several_commands_stops_waiting_at_its_timeout() -> None:
    log = PipelinedLog(round_s=0.5)
    group = GroupCommit(log.start)
    first = submit("slow")

    async def slow() -> None:
        await group.commit_all_async([first, submit("slower")], timeout=0.05)

    with pytest.raises(TimeoutError, match=first.cmd_id):
        asyncio.run(slow())
    group.stop()


def test_an_outcome_after_the_timeout_is_dropped_and_the_loop_goes_on() -> None:
    """The timer fails the waiter's future; the entry's outcome, arriving later, finds
    it done and is dropped (no error on the loop), and the next caller is answered."""
    started: list[tuple[c.Command, Done]] = []

    def start(entry: c.Command, done: Done) -> None:
        started.append((entry, done))

    group = GroupCommit(start, max_in_flight=1)
    slow = submit("slow")

    async def callers() -> tuple[str, Outcome, list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        try:
            await group.commit_async(slow, timeout=0.05)
        except TimeoutError as exc:
            message = str(exc)
        else:
            raise AssertionError("no timeout")
        started[0][1]([("ok", 1, "")], None)  # the late outcome, its slot freed
        await asyncio.sleep(0.05)
        answering = asyncio.ensure_future(group.commit_async(submit("next"), timeout=5))
        while len(started) < 2:
            await asyncio.sleep(0.01)
        started[1][1]([("ok", 2, "")], None)
        return message, await answering, errors

    message, outcome, errors = asyncio.run(callers())
    group.stop()
    assert message == f"command {slow.cmd_id} not committed in 0.05 s"
    assert outcome == ("ok", 2, "")
    assert errors == []


def test_a_cancelled_event_loop_caller_leaves_no_timer_to_fail_it_later() -> None:
    started: list[tuple[c.Command, Done]] = []
    group = GroupCommit(lambda entry, done: started.append((entry, done)))

    async def cancelled() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        task = asyncio.ensure_future(group.commit_async(submit("gone"), timeout=0.05))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)  # past the timeout: nothing fires on a cancelled future
        started[0][1]([("ok", 1, "")], None)
        await asyncio.sleep(0.01)
        return errors

    assert asyncio.run(cancelled()) == []
    group.stop()


def test_an_entry_never_answered_fails_its_waiters_and_frees_its_slot() -> None:
    answered: list[c.Command] = []

    def start(entry: c.Command, done: Done) -> None:
        if isinstance(entry, c.SubmitJob) and entry.spec.name == "lost":
            return  # a proposal Raft never answers (a leader deposed mid-round)
        answered.append(entry)
        done([("ok", len(answered), "")], None)

    group = GroupCommit(start, max_in_flight=1, entry_timeout_s=0.2)
    with pytest.raises(TimeoutError):
        group.commit(submit("lost"), timeout=5)
    assert group.commit(submit("next"), timeout=5) == ("ok", 1, "")
    group.stop()


def _await_ready(replica: Replica, *, leader: bool) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if replica.is_ready and replica.leader_address and (replica.is_leader or not leader):
            return
        time.sleep(0.05)
    raise TimeoutError("no leader")


def test_a_lone_replica_answers_an_event_loop_with_the_views_its_apply_built(
    tmp_path: Path,
) -> None:
    replica = Replica(
        address="127.0.0.1:0",
        peers=[],
        state_dir=str(tmp_path),
        on_effects=lambda command, effects: None,
        on_leader_change=lambda leading: None,
    )
    try:
        _await_ready(replica, leader=True)
        parts = (c.PartitionDef("gpu", default=True),)
        replica.commit(c.ConfigurePartitions(cmd_id(), 1000.0, parts))
        assert replica.partitions.default == "gpu" and set(replica.partitions.partitions) == {"gpu"}
        replica.commit(c.RegisterNode(cmd_id(), 1000.0, gpu_node("n1")))

        first = submit("x", hold=True)

        async def submit_some() -> list[Any]:
            return await replica.commit_all_async(
                [first, submit("big", gpus_per_node=64)], view=True
            )

        held, refused = asyncio.run(submit_some())
        assert isinstance(held, Submitted) and isinstance(refused, Rejected)
        assert held.job is not None and held.job["reason"] == "JobHeldUser"
        assert held.job["name"] == "x" and held.job["job_id"] == held.job_id
        # Retried, the same submission is the same job, as the state shows it now.
        again = asyncio.run(replica.commit_async(first, view=True))
        assert again.job_id == held.job_id and again.job["spec"]["name"] == "x"
        # Without `view`, a submission's result is its job id, as before.
        assert replica.commit(submit("plain")) == held.job_id + 1
    finally:
        replica.destroy()


def test_three_replicas_with_entries_in_flight_end_byte_for_byte_the_same(tmp_path: Path) -> None:
    """A real Raft group (three replicas on loopback, in this process), two entries in
    flight, threads and an event loop submitting at once: every replica applies the same
    log, so their states are the same bytes, and each client's jobs are in its order."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [
        Replica(
            address=address,
            peers=[a for a in addresses if a != address],
            state_dir=str(tmp_path / f"r{i}"),
            password="test-secret",
            on_effects=lambda command, effects: None,
            on_leader_change=lambda leading: None,
            max_in_flight=2,
        )
        for i, address in enumerate(addresses)
    ]
    try:
        for replica in replicas:
            _await_ready(replica, leader=False)
        leader = next(r for r in replicas if r.is_leader)
        parts = (c.PartitionDef("gpu", default=True),)
        leader.commit(c.ConfigurePartitions(cmd_id(), 1000.0, parts))
        leader.commit(c.RegisterNode(cmd_id(), 1000.0, gpu_node("n1")))
        mine: dict[str, list[int]] = {}

        def client(name: str) -> None:
            mine[name] = [leader.commit(submit(f"{name}-{k}", hold=True)) for k in range(15)]

        async def loop_clients() -> None:
            async def one(name: str) -> None:
                ids = []
                for k in range(15):
                    result = await leader.commit_async(submit(f"{name}-{k}", hold=True))
                    ids.append(result)
                mine[name] = ids

            await asyncio.gather(*(one(f"loop{i}") for i in range(8)))

        threads = [threading.Thread(target=client, args=(f"t{i}",)) for i in range(8)]
        for thread in threads:
            thread.start()
        asyncio.run(loop_clients())
        for thread in threads:
            thread.join()
        ids = [i for each in mine.values() for i in each]
        assert sorted(ids) == list(range(1, 241))
        assert all(each == sorted(each) for each in mine.values())
        with leader.lock:
            assert all(
                leader.state.jobs[job_id].spec.name == f"{name}-{k}"
                for name, each in mine.items()
                for k, job_id in enumerate(each)
            )
        index = leader.raft_info()["commit_index"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            r.raft_info()["last_applied"] < index for r in replicas
        ):
            time.sleep(0.05)
        states = []
        for replica in replicas:
            with replica.lock:
                states.append(replica.state.to_bytes())
        assert states[0] == states[1] == states[2]
    finally:
        for replica in replicas:
            replica.destroy()
