"""The Raft replica: a pysyncobj `SyncObj` whose one consumer holds the `ClusterState`.

Every replica applies every committed command; only the leader acts on the effects
(`on_effects` decides). The Raft layer is `scheduler.ctld.raft.SpurSyncObj`: pysyncobj with
Raft's AppendEntries rules fixed and its journal, term/vote and snapshots made durable
(fsync before a success is answered or a write acknowledged). Snapshots compact the log
(`SPUR_RAFT_SNAPSHOT_ENTRIES`, `SPUR_RAFT_SNAPSHOT_S`), and membership can change at
runtime (`add_member`, `remove_member`).

What listens: a replica of a group binds its Raft port to its configured address only
(pysyncobj would bind every interface), and a group needs a password, with which
pysyncobj authenticates and encrypts every message before it unpickles one. A lone
replica opens no port at all (`_LoneTransport`): nobody can send it anything.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from pysyncobj import SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.syncobj import _RAFT_STATE, SyncObjException
from pysyncobj.transport import Transport

from scheduler.core import commands as c
from scheduler.core.effects import Effect, Emit
from scheduler.core.errors import Rejected
from scheduler.core.state import INTERNAL, ClusterState
from scheduler.ctld.groupcommit import Done, GroupCommit, Outcome
from scheduler.ctld.raft import SpurSyncObj

log = logging.getLogger(__name__)

EffectSink = Callable[[c.Command, list[Effect]], None]
# The job dict a submission's caller gets back (its job id, the apply's `now`), built on
# the Raft thread while the state is locked; None when the job is gone already.
JobView = Callable[[ClusterState, int, float], dict[str, Any] | None]

# Log compaction: a snapshot once the log holds this many entries, or this long after
# the last one (pysyncobj's defaults); the environment can change both.
SNAPSHOT_ENTRIES = 5000
SNAPSHOT_S = 300.0
# Elections: a follower that stops hearing from the leader stands after a random
# 0.4-1.4 s (pysyncobj's defaults, kept: a loaded 2-core machine can pause a tick for a
# few hundred ms). A leader whose connection closes (a killed process) is replaced
# sooner: `raft.LOST_LEADER_ELECTION_S`.
ELECTION_TIMEOUT_S = (0.4, 1.4)
# How long one log entry may take to commit before its waiters are told it did not (it
# may still commit: a submission's idempotency key makes its retry land on the same job).
PROPOSE_TIMEOUT_S = 10.0
# Log entries proposed before the first is committed (groupcommit.py); the environment
# (SPUR_RAFT_IN_FLIGHT) can change it.
MAX_IN_FLIGHT = 2


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, raw, default)
        return default


class Submitted(NamedTuple):
    """A submission's result where its caller asked for the job's view: the job as the
    apply left it, so that the caller need not take the lock to read it back. Without
    "spec" when it is the submission's event's dict (not to be changed in place)."""

    job_id: int
    job: dict[str, Any] | None


class PartitionsView(NamedTuple):
    """The partitions as of the last apply that changed them (immutable): what the API
    checks a submission's time limit against before the log, without the lock."""

    partitions: Mapping[str, c.PartitionDef]
    default: str | None


_FAILURES = {v: k.lower() for k, v in vars(FAIL_REASON).items() if not k.startswith("_")}


class MembershipError(Exception):
    """A membership change was refused or did not commit."""


class ReplicaUnavailable(Exception):
    """The command could not be committed (no leader, timeout, shutting down)."""


class InsecureGroup(ValueError):
    """A group of replicas without a password: their Raft traffic would be unauthenticated
    pickles, which any host that reaches the port could use to run code."""


class LockOnEventLoop(RuntimeError):
    """The replica's lock was asked for on a thread that runs an event loop."""


class StateLock:
    """The replica's lock: a re-entrant lock that refuses to be taken on a thread that
    runs an asyncio event loop. The Raft thread holds it to apply every entry and the
    scheduling pass to plan; an event loop waiting for it stalls every request, heartbeat
    and report that controller serves (the API reads in its thread pool instead)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> bool:
        if asyncio._get_running_loop() is not None:
            raise LockOnEventLoop(
                "the replica's lock taken on the event loop: run this in the thread pool"
            )
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _LoneTransport(Transport):  # type: ignore[misc]
    """The transport of a replica without peers: it has no one to talk to, so it listens
    nowhere and sends nothing."""

    def tryGetReady(self) -> None:
        pass

    @property
    def ready(self) -> bool:
        return True

    def waitReady(self) -> None:
        pass

    def addNode(self, node: Any) -> None:
        pass

    def dropNode(self, node: Any) -> None:
        pass

    def send(self, node: Any, message: Any) -> bool:
        return False

    def destroy(self) -> None:
        pass


def _plain_view(state: ClusterState, job_id: int, now: float) -> dict[str, Any] | None:
    job = state.jobs.get(job_id)
    return None if job is None else state.job_dict(job, now, with_spec=True)


class _StateConsumer(SyncObjConsumer):  # type: ignore[misc]
    def __init__(
        self,
        lock: StateLock,
        on_effects: EffectSink,
        view: JobView,
        on_applied: Callable[[], None] | None,
    ) -> None:
        # Attributes set before SyncObjConsumer.__init__ are not replicated state.
        self._lock = lock
        self._on_effects = on_effects
        self._on_applied = on_applied
        self._view = view
        # Whether this replica leads (set by `Replica` once its Raft layer exists; None
        # while the journal replays at start): a follower's applies build no event
        # views (`JobTransitions.effect_views`), which only the leader sends.
        self.leading: Callable[[], bool] | None = None
        # The submissions (cmd_id) whose callers here want the job's view back: local
        # memory, filled before the proposal, read by the apply.
        self.wanted: set[str] = set()
        self.partitions_view = PartitionsView(MappingProxyType({}), None)
        # How many times the state changed here (an entry applied, a snapshot taken in):
        # what the reads' memo of answers is keyed by (`reads.ColumnsMemo`). Local: a
        # count of this process's changes, not the log's index.
        self.version = 0
        super().__init__()
        self.state = ClusterState()

    @replicated  # type: ignore[untyped-decorator]
    def apply(self, command: c.Command) -> Outcome | list[Outcome]:
        """One command's outcome, or a `Batch`'s: each of its commands' in order."""
        commands = command.commands if isinstance(command, c.Batch) else (command,)
        leading = self.leading
        with self._lock:
            self.version += 1
            # A follower builds the views its own callers wait for (`wanted`), no others.
            self.state.effect_views = leading is None or bool(self.wanted) or leading()
            results = self.state.apply_each(commands)
            outcomes = [self._outcome(c_, r) for c_, r in zip(commands, results, strict=True)]
            if any(isinstance(c_, c.ConfigurePartitions) for c_ in commands):
                self._publish()
        for cmd, result in zip(commands, results, strict=True):
            if not isinstance(result, Rejected):
                self._on_effects(cmd, result)
        if self._on_applied is not None:
            self._on_applied()
        return outcomes if isinstance(command, c.Batch) else outcomes[0]

    def _outcome(self, command: c.Command, result: list[Effect] | Rejected) -> Outcome:
        if isinstance(result, Rejected):
            if result.code == INTERNAL:
                log.error("command %s refused: %s", command.cmd_id, result.message)
            return ("rejected", result.message, result.code)
        if isinstance(command, c.SubmitJob):
            job_id = self.state.submissions[command.cmd_id]
            if command.cmd_id in self.wanted:
                return ("ok", Submitted(job_id, self._submitted_view(job_id, command, result)), "")
            return ("ok", job_id, "")
        return ("ok", None, "")

    def _submitted_view(
        self, job_id: int, command: c.SubmitJob, effects: list[Effect]
    ) -> dict[str, Any] | None:
        """The submitted job as its caller gets it: its `submitted` event's job dict,
        built by the apply already (shared with the event: the caller copies it to add
        the spec it sent); the state's view, with its spec, for a retried submission
        (no event: the job may have moved on since)."""
        for effect in effects:
            if isinstance(effect, Emit) and effect.job_id == job_id and effect.job:
                return effect.job
        return self._view(self.state, job_id, command.now)

    def _publish(self) -> None:
        # Under the lock, by the one thread that changes the state.
        state = self.state
        self.partitions_view = PartitionsView(
            MappingProxyType(dict(state.partitions)), state.default_partition
        )

    def _deserialize(self, data: Any) -> None:
        # A snapshot replaces the state: not while a reader holds the lock.
        with self._lock:
            self.version += 1
            super()._deserialize(data)
            self._publish()


class Replica:
    def __init__(
        self,
        *,
        address: str,
        peers: list[str],
        state_dir: str,
        password: str = "",
        on_effects: EffectSink,
        on_leader_change: Callable[[bool], None],
        job_view: JobView = _plain_view,
        on_applied: Callable[[], None] | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        """`on_effects` gets each command's effects as it is applied (on the Raft thread,
        every replica), `on_applied` is called once each log entry's commands are."""
        if peers and not password:
            raise InsecureGroup(
                "a controller with raft_peers needs raft_password (it authenticates and "
                "encrypts the replicas' traffic)"
            )
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        self.lock = StateLock()
        self._consumer = _StateConsumer(self.lock, on_effects, job_view, on_applied)
        self._on_leader_change = on_leader_change
        self._flush_lock = threading.Lock()
        safe = address.replace(":", "_")
        conf = SyncObjConf(
            journalFile=os.path.join(state_dir, f"raft-{safe}.journal"),
            fullDumpFile=os.path.join(state_dir, f"raft-{safe}.dump"),
            password=password or None,
            bindAddress=address,  # this address only, never every interface
            # Forking for snapshots is unsafe next to uvicorn's and the loop's threads.
            useFork=False,
            dynamicMembershipChange=True,
            logCompactionMinEntries=int(
                _env_number("SPUR_RAFT_SNAPSHOT_ENTRIES", SNAPSHOT_ENTRIES)
            ),
            logCompactionMinTime=_env_number("SPUR_RAFT_SNAPSHOT_S", SNAPSHOT_S),
            raftMinTimeout=ELECTION_TIMEOUT_S[0],
            raftMaxTimeout=ELECTION_TIMEOUT_S[1],
            onStateChanged=self._state_changed,
            commandsWaitLeader=True,
            connectionRetryTime=1.0,
            # Send each new entry to the followers at once rather than on the next
            # append-entries period (0.1 s): a submit waits on that round trip.
            appendEntriesUseBatch=False,
        )
        self._single = not peers
        self._sync = SpurSyncObj(
            address,
            peers,
            conf=conf,
            consumers=[self._consumer],
            **({} if peers else {"transportClass": _LoneTransport}),
        )
        self._sync.addOnTickCallback(self._nudge)
        self._consumer.leading = self._sync._isLeader
        in_flight = max_in_flight or int(_env_number("SPUR_RAFT_IN_FLIGHT", MAX_IN_FLIGHT))
        self._group = GroupCommit(
            self._start, max_in_flight=in_flight, entry_timeout_s=PROPOSE_TIMEOUT_S
        )

    def _start(self, entry: c.Command, done: Done) -> None:
        """Propose one log entry; `done` gets each of its commands' outcome once it is
        applied here (on the Raft thread), or why it was not committed."""
        batch = isinstance(entry, c.Batch)

        def applied(answer: Any, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                reason = _FAILURES.get(error, str(error))
                done(None, ReplicaUnavailable(f"command not committed: {reason}"))
                return
            # The Raft layer synced what it committed; this is a no-op then, and makes
            # sure of it otherwise (one fdatasync covers every entry before it).
            self.flush_journal()
            done(list(answer) if batch else [answer], None)

        try:
            self._consumer.apply(entry, callback=applied)
        except SyncObjException as exc:
            raise ReplicaUnavailable(f"command not committed: {exc.errorCode}") from exc

    def _nudge(self) -> None:
        # pysyncobj appends queued commands at the end of a tick and then sleeps up to
        # autoTickPeriod before it counts them committed. A lone replica needs no
        # follower's answer to wake it, so the next tick follows at once: a commit takes
        # about a millisecond instead of 50-100. (Private attributes; pysyncobj 0.3.x.)
        sync = self._sync
        if (
            self._single
            and sync._isLeader()
            and sync._SyncObj__getCurrentLogIndex() > sync.raftCommitIndex
        ):
            sync.tick_again()

    @property
    def partitions(self) -> PartitionsView:
        """The partitions as the last apply left them: read without the lock."""
        view: PartitionsView = self._consumer.partitions_view
        return view

    @property
    def version(self) -> int:
        """How many times the state changed in this process: read it under `lock`, with
        the state it numbers."""
        version: int = self._consumer.version
        return version

    @property
    def state(self) -> ClusterState:
        """Read it only while holding `lock`."""
        state: ClusterState = self._consumer.state
        return state

    def _state_changed(self, old: int, new: int) -> None:
        if (old == _RAFT_STATE.LEADER) != (new == _RAFT_STATE.LEADER):
            self._on_leader_change(new == _RAFT_STATE.LEADER)

    def commit(self, command: c.Command, *, timeout: float = 10.0) -> Any:
        """Propose `command` (in the next log entry, with whatever else is waiting: group
        commit) and wait until it is applied here; return its result or raise `Rejected`
        (the state refused it) or `ReplicaUnavailable`."""
        return _result(self._wait(lambda: self._group.commit(command, timeout=timeout), timeout))

    def commit_all(
        self, commands: Sequence[c.Command], *, timeout: float = 10.0
    ) -> list[Any | Rejected]:
        """Several commands at once, in one log entry where they fit: each one's result,
        or the `Rejected` that refused it (the others apply all the same)."""
        outcomes = self._wait(lambda: self._group.commit_all(commands, timeout=timeout), timeout)
        out: list[Any | Rejected] = []
        for outcome in outcomes:
            try:
                out.append(_result(outcome))
            except Rejected as exc:
                out.append(exc)
        return out

    async def commit_async(
        self, command: c.Command, *, timeout: float = 10.0, view: bool = False
    ) -> Any:
        """`commit`, awaited on the running event loop (no thread waits for it). `view`:
        a submission's result is `Submitted`, its job's view built by the apply."""
        want = view and isinstance(command, c.SubmitJob)
        if want:
            self._consumer.wanted.add(command.cmd_id)
        try:
            outcome = await self._await(self._group.commit_async(command, timeout=timeout), timeout)
        finally:
            if want:
                self._consumer.wanted.discard(command.cmd_id)
        return _result(outcome)

    async def commit_all_async(
        self, commands: Sequence[c.Command], *, timeout: float = 10.0, view: bool = False
    ) -> list[Any | Rejected]:
        """`commit_all`, awaited on the running event loop; `view` as for `commit_async`."""
        wanted = [cmd.cmd_id for cmd in commands if view and isinstance(cmd, c.SubmitJob)]
        self._consumer.wanted.update(wanted)
        try:
            outcomes = await self._await(
                self._group.commit_all_async(commands, timeout=timeout), timeout
            )
        finally:
            self._consumer.wanted.difference_update(wanted)
        out: list[Any | Rejected] = []
        for outcome in outcomes:
            try:
                out.append(_result(outcome))
            except Rejected as exc:
                out.append(exc)
        return out

    @staticmethod
    def _wait(call: Callable[[], Any], timeout: float) -> Any:
        try:
            return call()
        except TimeoutError:
            raise ReplicaUnavailable(f"command not committed within {timeout} s") from None
        except RuntimeError as exc:  # stopping
            raise ReplicaUnavailable(str(exc)) from None

    @staticmethod
    async def _await(call: Awaitable[Any], timeout: float) -> Any:
        try:
            return await call
        except TimeoutError:
            raise ReplicaUnavailable(f"command not committed within {timeout} s") from None
        except RuntimeError as exc:  # stopping
            raise ReplicaUnavailable(str(exc)) from None

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no command is queued or in flight here, `timeout` at most."""
        return self._group.wait_idle(timeout)

    def flush_journal(self) -> None:
        # The Raft layer already synced what it committed; this is a no-op then, and
        # makes sure of it otherwise (one fdatasync covers every entry before it).
        with self._flush_lock:
            self._sync.flush_journal()

    @property
    def is_leader(self) -> bool:
        return bool(self._sync._isLeader())

    @property
    def is_ready(self) -> bool:
        return bool(self._sync.isReady())

    @property
    def leader_address(self) -> str:
        leader = self._sync._getLeader()
        return "" if leader is None else str(getattr(leader, "address", leader))

    @property
    def self_address(self) -> str:
        return str(self._sync.selfNode.address)

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self._sync.getStatus()
        return status

    def raft_info(self) -> dict[str, Any]:
        """Role, term, commit index, log positions and members (see `SpurSyncObj`)."""
        info: dict[str, Any] = self._sync.raft_info()
        return info

    def add_member(self, address: str, *, timeout: float = 10.0) -> None:
        """Add the replica at Raft `address` to the group (one change at a time; start
        it first with every current member as its peers)."""
        self._change_members("add", address, timeout)

    def remove_member(self, address: str, *, timeout: float = 10.0) -> None:
        """Remove the replica at Raft `address` from the group (then stop it)."""
        self._change_members("remove", address, timeout)

    def _change_members(self, action: str, address: str, timeout: float) -> None:
        if self._single:
            raise MembershipError(
                "a lone replica (no raft_peers) has no Raft port: start it as a group"
            )
        members = self.raft_info()["members"]
        if action == "add" and address in members:
            raise MembershipError(f"{address} is already a member")
        if action == "remove" and address not in members:
            raise MembershipError(f"{address} is not a member")
        if action == "remove" and address == self.leader_address:
            raise MembershipError(
                f"{address} is the leader, which cannot remove itself: stop it first (another "
                "replica is elected), then remove it"
            )
        done = threading.Event()
        outcome: list[Any] = []

        def finished(result: Any, error: Any) -> None:
            outcome.append(error)
            done.set()

        if action == "add":
            self._sync.addNodeToCluster(address, callback=finished)
        else:
            self._sync.removeNodeFromCluster(address, callback=finished)
        if not done.wait(timeout):
            raise ReplicaUnavailable(f"membership change not committed within {timeout} s")
        error = outcome[0]
        if error == FAIL_REASON.SUCCESS:
            return
        if error == FAIL_REASON.REQUEST_DENIED:
            raise MembershipError(
                "the leader refused the change (another change is still committing, or "
                "the leader has not committed an entry of its term yet): try again"
            )
        raise ReplicaUnavailable(f"membership change not committed: {error}")

    def destroy(self) -> None:
        self._group.stop()
        self.flush_journal()
        self._sync.destroy()


def _result(outcome: Outcome) -> Any:
    status, result, code = outcome
    if status == "rejected":
        raise Rejected(result, code=code)
    return result
