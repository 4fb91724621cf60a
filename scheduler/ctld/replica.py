"""The Raft replica: a pysyncobj `SyncObj` whose one consumer holds the `ClusterState`.

Every replica applies every committed command; only the leader acts on the effects
(`on_effects` decides). The journal is a memory-mapped file: pysyncobj writes to it but
never flushes, so `flush_journal()` msyncs it before the controller acknowledges a
write, which is what "restarting keeps every acknowledged job" needs.

What listens: a replica of a group binds its Raft port to its configured address only
(pysyncobj would bind every interface), and a group needs a password, with which
pysyncobj authenticates and encrypts every message before it unpickles one. A lone
replica opens no port at all (`_LoneTransport`): nobody can send it anything.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import _RAFT_STATE, SyncObjException
from pysyncobj.transport import Transport

from scheduler.core import commands as c
from scheduler.core.effects import Effect
from scheduler.core.errors import Rejected
from scheduler.core.state import INTERNAL, ClusterState

log = logging.getLogger(__name__)

EffectSink = Callable[[c.Command, list[Effect]], None]


class ReplicaUnavailable(Exception):
    """The command could not be committed (no leader, timeout, shutting down)."""


class InsecureGroup(ValueError):
    """A group of replicas without a password: their Raft traffic would be unauthenticated
    pickles, which any host that reaches the port could use to run code."""


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


class _StateConsumer(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self, lock: threading.RLock, on_effects: EffectSink) -> None:
        # Attributes set before SyncObjConsumer.__init__ are not replicated state.
        self._lock = lock
        self._on_effects = on_effects
        super().__init__()
        self.state = ClusterState()

    @replicated  # type: ignore[untyped-decorator]
    def apply(self, command: c.Command) -> tuple[str, Any, str]:
        with self._lock:
            try:
                effects = self.state.apply(command)
            except Rejected as exc:
                if exc.code == INTERNAL:
                    log.error("command %s refused: %s", command.cmd_id, exc.message)
                return ("rejected", exc.message, exc.code)
            result: Any = None
            if isinstance(command, c.SubmitJob):
                result = self.state.submissions[command.cmd_id]
        self._on_effects(command, effects)
        return ("ok", result, "")


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
    ) -> None:
        if peers and not password:
            raise InsecureGroup(
                "a controller with raft_peers needs raft_password (it authenticates and "
                "encrypts the replicas' traffic)"
            )
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._consumer = _StateConsumer(self.lock, on_effects)
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
            dynamicMembershipChange=False,
            onStateChanged=self._state_changed,
            commandsWaitLeader=True,
            connectionRetryTime=1.0,
            # Send each new entry to the followers at once rather than on the next
            # append-entries period (0.1 s): a submit waits on that round trip.
            appendEntriesUseBatch=False,
        )
        self._single = not peers
        self._sync = SyncObj(
            address,
            peers,
            conf=conf,
            consumers=[self._consumer],
            **({} if peers else {"transportClass": _LoneTransport}),
        )
        self._sync.addOnTickCallback(self._nudge)

    def _nudge(self) -> None:
        # pysyncobj appends queued commands at the end of a tick and then sleeps up to
        # autoTickPeriod before it counts them committed. A lone replica needs no
        # follower's answer to wake it, so wake the tick loop at once: a commit takes
        # about a millisecond instead of 50-100. (Private attributes; pysyncobj 0.3.x.)
        sync = self._sync
        if (
            self._single
            and sync._isLeader()
            and sync._SyncObj__getCurrentLogIndex() > sync.raftCommitIndex
        ):
            sync._SyncObj__pipeNotifier.notify()

    @property
    def state(self) -> ClusterState:
        """Read it only while holding `lock`."""
        state: ClusterState = self._consumer.state
        return state

    def _state_changed(self, old: int, new: int) -> None:
        if (old == _RAFT_STATE.LEADER) != (new == _RAFT_STATE.LEADER):
            self._on_leader_change(new == _RAFT_STATE.LEADER)

    def commit(self, command: c.Command, *, timeout: float = 10.0) -> Any:
        """Propose `command` and wait until it is applied here; return its result or raise
        `Rejected` (the state refused it) or `ReplicaUnavailable`."""
        try:
            answer = self._consumer.apply(command, sync=True, timeout=timeout)
        except SyncObjException as exc:
            raise ReplicaUnavailable(f"command not committed: {exc.errorCode}") from exc
        status, result, code = answer
        if status == "rejected":
            raise Rejected(result, code=code)
        self.flush_journal()
        return result

    def flush_journal(self) -> None:
        # pysyncobj keeps its journal in a private attribute and never msyncs it; one
        # flush covers every entry written before it, so concurrent callers share one.
        journal = getattr(self._sync, "_SyncObj__raftLog", None)
        if journal is not None and hasattr(journal, "flush"):
            with self._flush_lock:
                journal.flush()

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

    def destroy(self) -> None:
        self.flush_journal()
        self._sync.destroy()
