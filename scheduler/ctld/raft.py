"""Our corrections to pysyncobj 0.3.x: Raft's log-matching rule and durability.

`SpurSyncObj` is pysyncobj's `SyncObj` with its follower-side AppendEntries rewritten.
pysyncobj deletes every entry after `prevLogIdx` whenever a message with such an index
arrives, even when the entries it carries are ones the follower already holds: a stale
or duplicated AppendEntries (a leader that resent from an older `nextIndex`, a replica
that restarted) cut off entries the follower had already applied, and the state machine
diverged from the log (it logged "truncating already-applied log entries"). Raft (§5.3)
says: skip the entries already present, truncate only from the first entry whose term
conflicts, append the rest, and advance the commit index no further than the last entry
the message carried. An entry at or below the commit index never conflicts in a correct
cluster; if one ever does (a replica that lost its disk), we refuse the message and log
it rather than cut applied history out from under the state machine.

Durability, which pysyncobj leaves to the page cache, is `scheduler/ctld/journal.py`'s
(the journal synced with fdatasync, the term and vote, compaction and snapshots written
durably); `SpurSyncObj` syncs it when Raft says it must: a follower before it answers an
AppendEntries, every replica at the end of the tick it appended in.

Elections: `SpurSyncObj` starts one soon after the leader's connection closes (a killed
process), instead of waiting out the full election timeout; a leader that is merely
slow still gets the whole timeout, so a loaded machine does not flap.

Messages between replicas: pysyncobj deflates each one (level 3) before it encrypts it.
A replica's messages are small (an entry of a few submissions is about 1.5 KB pickled,
an acknowledgement a hundred bytes) and travel a LAN: deflating costs the sender 4-17 µs
a message and the receiver 1-6 µs to save a few hundred bytes. `_WireZlib` keeps the
zlib format (level 0, stored blocks: a replica of an earlier version reads it, and we
read its deflated ones) and drops the compression work; a small message is framed in
Python, as zlib's calls release the GIL and the tick thread then waits for it.

`install()` (run on import) points pysyncobj's journal factory, its snapshot rename and
its connections' zlib at these; only our replicas use pysyncobj in a controller process.
"""

from __future__ import annotations

import logging
import queue
import random
import struct
import threading
import zlib
from typing import Any

import pysyncobj.pickle as ps_pickle
import pysyncobj.serializer as ps_serializer
import pysyncobj.syncobj as ps_syncobj
import pysyncobj.tcp_connection as ps_tcp_connection
from pysyncobj import SyncObj
from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.syncobj import _RAFT_STATE

from scheduler.ctld.journal import create_journal, durable_replace

log = logging.getLogger(__name__)

# After the leader's connection closes, an election starts within this many seconds
# (random, so the followers rarely split the vote), instead of raftMinTimeout..Max.
LOST_LEADER_ELECTION_S = (0.05, 0.3)


# Up to this size, a message is framed as zlib's stored blocks here, in Python: zlib's
# compress and decompress release the GIL for any size, and the tick thread then waits
# for the event loop's thread to give it back (up to the switch interval, 0.5 ms) several
# times a round; adler32 keeps it below 5 KiB.
_STORED_INLINE = 5 * 1024
_STORED_HEADER = b"\x78\x01"  # deflate, 32 KiB window, level 0: what zlib.compress(x, 0) writes


class _WireZlib:
    """pysyncobj's connections' `zlib` (module docstring): stored, not deflated, and a
    small message framed without leaving the interpreter (byte for byte what
    `zlib.compress(data, 0)` writes, read back as `zlib.decompress` reads it)."""

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        size = len(data)
        if size > _STORED_INLINE:
            return zlib.compress(data, 0)
        block = struct.pack("<BHH", 1, size, size ^ 0xFFFF)  # the final (only) block
        return b"".join((_STORED_HEADER, block, data, struct.pack(">I", zlib.adler32(data))))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        size = len(data) - 11  # header 2, block header 5, adler32 4
        if (
            0 <= size <= _STORED_INLINE
            and data[:2] == _STORED_HEADER
            and data[2] == 1
            and struct.unpack_from("<HH", data, 3) == (size, size ^ 0xFFFF)
        ):
            body = bytes(data[7 : 7 + size])
            if struct.unpack_from(">I", data, 7 + size)[0] == zlib.adler32(body):
                return body
        return zlib.decompress(data)  # deflated (an earlier replica), large, or damaged


_installed = False


def install() -> None:
    """Point pysyncobj at the durable journal, the durable snapshot rename and the
    stored (not deflated) messages."""
    global _installed
    if _installed:
        return
    ps_syncobj.createJournal = create_journal
    ps_serializer.atomicReplace = durable_replace
    ps_tcp_connection.zlib = _WireZlib
    _installed = True


class SpurSyncObj(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj with Raft's AppendEntries rules on the follower side (module
    docstring). The overrides replace name-mangled private methods of SyncObj 0.3.x,
    which its transport and tick loop look up on the instance."""

    # SyncObj's private state that the overrides read and write.
    _SyncObj__raftLeader: Any
    _SyncObj__raftElectionDeadline: float
    _SyncObj__raftCommitIndex: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install()
        # Set before SyncObj.__init__: attributes that exist then are not snapshotted.
        self._spur_refused = 0
        self._spur_ticker: int | None = None  # the thread that runs the ticks
        self._spur_proposed = False  # a command was proposed on the tick thread
        self._spur_poll_now = False  # the tick's poll returns at once (`tick_again`)
        super().__init__(*args, **kwargs)
        self.addOnTickCallback(self._spur_flush)
        poll = self._poller.poll

        def poll_once(timeout: float) -> None:
            if self._spur_poll_now:
                self._spur_poll_now = False
                timeout = 0.0
            poll(timeout)

        self._poller.poll = poll_once

    def tick_again(self) -> None:
        """On the tick thread (a tick callback): the next tick follows this one at once,
        its poll only taking what is ready. pysyncobj's way is a byte written to its
        own pipe, for the poll to wake on and read back: two system calls and a
        callback a log entry, for a thread that is awake already."""
        self._spur_poll_now = True

    # -- durability -------------------------------------------------------------------

    def _spur_flush(self) -> None:
        # End of a tick: what the leader appended during it is synced before the next
        # tick counts its own log toward a commit.
        self.flush_journal()

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803
        # And at the start of one, for what message handlers appended in the last poll
        # (a new leader's no-op): the leader counts itself toward every commit.
        self._spur_ticker = threading.get_ident()
        self.flush_journal()
        super()._onTick(timeToWait)

    # -- proposing ------------------------------------------------------------------

    def _applyCommand(self, command: Any, callback: Any, commandType: Any = None) -> None:  # noqa: N802, N803
        """pysyncobj queues a command and writes a byte to its pipe, so that the tick
        thread wakes from its poll and appends it. A command proposed on the tick thread
        itself (the group commit proposes the next entry from the callback of the one
        just applied) needs no wake-up: the same tick appends it next
        (`_checkCommandsToApply` follows the applies, and every poll is followed by
        another tick), and the byte would only cost a write, a poll and a read."""
        if threading.get_ident() != self._spur_ticker:
            SyncObj._applyCommand(self, command, callback, commandType)
            return
        if commandType is not None:
            command = bytes([commandType]) + command
        try:
            self._SyncObj__commandsQueue.put_nowait((command, callback))
        except queue.Full:
            self._SyncObj__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)
            return
        self._spur_proposed = True

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802
        """pysyncobj's apply, which asks its tick to send every follower an AppendEntries
        at once, so that they learn the new commit index. When the apply's callbacks
        proposed the next entry (the group commit's steady state), the same tick appends
        it and sends it to every follower with that commit index: the first message, and
        each follower's answer to it, are left out. Otherwise (nothing proposed, or a
        proposal that was not appended) the followers hear it as before, or from the
        next heartbeat at the latest."""
        self._spur_proposed = False
        need_send: bool = SyncObj._SyncObj__applyLogEntries(self)
        if need_send and self._spur_proposed and self._isLeader():
            return False
        return need_send

    def flush_journal(self) -> None:
        journal = self._SyncObj__raftLog
        if hasattr(journal, "flush"):
            journal.flush()

    # -- elections ----------------------------------------------------------------------

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:  # noqa: N802
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        if node == self._SyncObj__raftLeader and self._SyncObj__raftState == _RAFT_STATE.FOLLOWER:
            soon = monotonic_time() + random.uniform(*LOST_LEADER_ELECTION_S)
            if soon < self._SyncObj__raftElectionDeadline:
                self._SyncObj__raftElectionDeadline = soon

    # -- AppendEntries ----------------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        if (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and message["term"] >= self._SyncObj__raftCurrentTerm
        ):
            self._spur_append_entries(node, message)
            return
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _spur_append_entries(self, node: Any, message: dict[str, Any]) -> None:
        """The follower's AppendEntries with entries (not a snapshot), as Raft §5.3 has it;
        the bookkeeping before the log work is pysyncobj's own."""
        term = message["term"]
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = (
                monotonic_time() + self._SyncObj__generateRaftTimeout()
            )
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        entries = list(message.get("entries", []))
        leader_commit = message["commit_index"]
        self._SyncObj__leaderCommitIndex = leader_commit

        transmission = message.get("transmission")
        if transmission is not None:  # one large entry, in pieces
            if transmission == "start":
                self._SyncObj__recvTransmission = message["data"]
                self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
                return
            if transmission == "process":
                self._SyncObj__recvTransmission += message["data"]
                self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
                return
            if transmission != "finish":
                raise ValueError(f"unknown transmission {transmission!r}")
            self._SyncObj__recvTransmission += message["data"]
            entries = [ps_pickle.loads(self._SyncObj__recvTransmission)]
            self._SyncObj__recvTransmission = ""

        prev_idx = message["prevLogIdx"]
        prev_term = message["prevLogTerm"]
        prev = self._SyncObj__getEntries(prev_idx, 1)
        if not prev:
            self._SyncObj__sendNextNodeIdx(node, success=False, reset=True)
            return
        if prev[0][2] != prev_term:
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=prev_idx, success=False, reset=True)
            return

        journal = self._SyncObj__raftLog
        first = journal[0][1]
        last = journal[-1][1]
        dynamic = self._SyncObj__conf.dynamicMembershipChange
        new_from = len(entries)  # entries[new_from:] are not in the log yet
        for i, entry in enumerate(entries):
            idx, entry_term = entry[1], entry[2]
            if idx > last:
                new_from = i
                break
            if journal[idx - first][2] == entry_term:
                continue  # already here: Raft keeps it
            protected = max(self._SyncObj__raftLastApplied, self._SyncObj__raftCommitIndex)
            if idx <= protected:
                self._spur_refused += 1
                log.critical(
                    "refusing append_entries from %s: entry %d (term %d) conflicts with a "
                    "committed entry here (term %d, commit %d); this replica's log "
                    "diverged from the leader's",
                    node,
                    idx,
                    entry_term,
                    journal[idx - first][2],
                    protected,
                )
                self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
                return
            if dynamic:  # undo the membership changes being cut off
                for old in reversed(journal[idx - first :]):
                    change = self._SyncObj__parseChangeClusterRequest(old[0])
                    if change is not None:
                        self._SyncObj__doChangeCluster(change, reverse=True)
            self._SyncObj__deleteEntriesFrom(idx)
            new_from = i
            break
        appended = entries[new_from:]
        for entry in appended:
            journal.add(*entry)
        if dynamic:
            for entry in appended:
                change = self._SyncObj__parseChangeClusterRequest(entry[0])
                if change is not None:
                    self._SyncObj__doChangeCluster(change)
        # The leader counts a success toward the commit: the entries must be on disk.
        self.flush_journal()

        last_new = entries[-1][1] if entries else prev_idx
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=last_new + 1, success=True)

        # Raft: commitIndex = min(leaderCommit, index of the last new entry): entries
        # after it that this message did not vouch for may still be a stale leader's.
        if leader_commit > self._SyncObj__raftCommitIndex:
            commit = min(leader_commit, last_new)
            if commit > self._SyncObj__raftCommitIndex:
                self._SyncObj__raftCommitIndex = commit
        self._SyncObj__raftLog.setRaftCommitIndex(self._SyncObj__raftCommitIndex)

    # -- what the controller shows ------------------------------------------------------

    def raft_info(self) -> dict[str, Any]:
        """This replica's view of the group, for /v1/raft and /metrics. Read on another
        thread than the tick loop: values may be a tick apart."""
        for _ in range(10):
            try:
                return self._raft_info()
            except RuntimeError:  # a dict or set the tick loop changed while we copied it
                continue
        return self._raft_info()

    def _raft_info(self) -> dict[str, Any]:
        journal = self._SyncObj__raftLog
        try:
            first, last = journal[0][1], journal[-1][1]
        except IndexError:
            first = last = 0
        leader = self._SyncObj__raftLeader
        state = self._SyncObj__raftState
        match = dict(self._SyncObj__raftMatchIndex)
        return {
            "self": str(self.selfNode.address),
            "role": {0: "follower", 1: "candidate", 2: "leader"}.get(state, str(state)),
            "term": int(self._SyncObj__raftCurrentTerm),
            "leader": "" if leader is None else str(getattr(leader, "address", leader)),
            "commit_index": int(self._SyncObj__raftCommitIndex),
            "last_applied": int(self._SyncObj__raftLastApplied),
            "log_first_index": int(first),
            "log_last_index": int(last),
            "log_entries": len(journal),
            "members": sorted(
                [str(self.selfNode.address)] + [str(n.address) for n in self.otherNodes]
            ),
            "connected": sorted(str(n.address) for n in self.otherNodes if self.isNodeConnected(n)),
            "match_index": (
                {str(n.address): int(i) for n, i in match.items()} if state == 2 else {}
            ),
            "refused_append_entries": self._spur_refused,
        }
