"""Raft's log rules on a follower, with real pysyncobj `SyncObj` objects (our
`SpurSyncObj`): the follower's message handler is fed AppendEntries as a leader would
send them, and its log, commit index and applied state are read back.

Against plain pysyncobj 0.3.x (`SYNC_CLASS = SyncObj`) the first three tests fail: it
deletes every entry after `prevLogIdx`, applied or not, and never syncs its journal."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pysyncobj.pickle as ps_pickle
import pysyncobj.tcp_connection as ps_tcp
import pytest
from pysyncobj import SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.node import TCPNode
from pysyncobj.transport import Transport

from scheduler.ctld import raft
from scheduler.ctld.journal import DurableJournal
from scheduler.ctld.raft import SpurSyncObj

SYNC_CLASS = SpurSyncObj
LEADER = "127.0.0.1:1"  # never dialled: the transport below sends nothing


class RecordingTransport(Transport):  # type: ignore[misc]
    """A transport that connects nowhere and keeps what the follower answers."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        super().__init__(syncObj, selfNode, otherNodes)
        self.sent: list[dict[str, Any]] = []
        self.events: list[str] | None = None

    def tryGetReady(self) -> None:  # noqa: N802
        pass

    @property
    def ready(self) -> bool:
        return True

    def waitReady(self) -> None:  # noqa: N802
        pass

    def addNode(self, node: Any) -> None:  # noqa: N802
        pass

    def dropNode(self, node: Any) -> None:  # noqa: N802
        pass

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append(message)
        if self.events is not None:
            self.events.append(f"send {message['type']}")
        return True

    def destroy(self) -> None:
        pass


class Counter(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.values: list[int] = []

    @replicated  # type: ignore[untyped-decorator]
    def add(self, value: int) -> None:
        self.values.append(value)


class Follower:
    def __init__(self, tmp_path: Path) -> None:
        self.counter = Counter()
        self.sync = SYNC_CLASS(
            "127.0.0.1:2",
            [LEADER],
            conf=SyncObjConf(
                autoTick=False,
                journalFile=str(tmp_path / "journal"),
                fullDumpFile=str(tmp_path / "dump"),
                useFork=False,
                raftMinTimeout=60,  # no election of its own during a test
                raftMaxTimeout=61,
                connectionTimeout=61,
            ),
            consumers=[self.counter],
            transportClass=RecordingTransport,
        )
        self.transport: RecordingTransport = self.sync._SyncObj__transport
        self.leader = TCPNode(LEADER)
        consumer = id(self.counter)
        self.func_id = self.sync._methodToID[(consumer, self.sync._getFuncName((consumer, "add")))]

    def entry(self, value: int, idx: int, term: int) -> tuple[bytes, int, int]:
        return (b"\x00" + ps_pickle.dumps((self.func_id, (value,))), idx, term)

    def append(
        self,
        term: int,
        prev: tuple[int, int],
        entries: list[tuple[bytes, int, int]],
        commit: int,
    ) -> dict[str, Any]:
        """Deliver one AppendEntries; tick so the committed entries apply; the answer."""
        self.transport.sent.clear()
        self.sync._SyncObj__onMessageReceived(
            self.leader,
            {
                "type": "append_entries",
                "term": term,
                "commit_index": commit,
                "entries": entries,
                "prevLogIdx": prev[0],
                "prevLogTerm": prev[1],
            },
        )
        for _ in range(3):
            self.sync.doTick(0.0)
        answers = [m for m in self.transport.sent if m["type"] == "next_node_idx"]
        assert answers, self.transport.sent
        return answers[0]

    def log(self) -> list[tuple[int, int]]:
        journal = self.sync._SyncObj__raftLog
        return [(journal[i][1], journal[i][2]) for i in range(len(journal))]

    def close(self) -> None:
        self.sync._doDestroy()


@pytest.fixture
def follower(tmp_path: Path) -> Any:
    f = Follower(tmp_path)
    yield f
    f.close()


def test_a_stale_append_entries_keeps_the_entries_it_already_applied(follower: Follower) -> None:
    e = follower.entry
    answer = follower.append(1, (1, 0), [e(1, 2, 1), e(2, 3, 1), e(3, 4, 1)], commit=4)
    assert answer["success"] and answer["next_node_idx"] == 5
    assert follower.counter.values == [1, 2, 3]
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]

    # The leader resends its first entry (an older AppendEntries, delivered late):
    # every entry it carries is already here, so nothing may be cut.
    answer = follower.append(1, (1, 0), [e(1, 2, 1)], commit=4)
    assert answer["success"]
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert follower.sync.raftLastApplied == 4

    # The log goes on from where it was: the next entry follows entry 4.
    answer = follower.append(1, (4, 1), [e(4, 5, 1)], commit=5)
    assert answer["success"] and answer["next_node_idx"] == 6
    assert follower.counter.values == [1, 2, 3, 4]
    assert follower.log()[-1] == (5, 1)


def test_an_empty_append_entries_cuts_nothing_and_commits_only_what_it_vouches_for(
    follower: Follower,
) -> None:
    e = follower.entry
    follower.append(1, (1, 0), [e(1, 2, 1), e(2, 3, 1), e(3, 4, 1)], commit=2)
    assert follower.counter.values == [1]
    # A heartbeat of a new leader that matched entry 2 and has committed up to 4: the
    # follower's 3 and 4 may not be the leader's 3 and 4, so they stay uncommitted...
    answer = follower.append(2, (2, 1), [], commit=4)
    assert answer["success"] and answer["next_node_idx"] == 3
    assert follower.sync.raftCommitIndex == 2
    assert follower.counter.values == [1]
    # ...but they are kept until an entry conflicts with them: truncation starts at the
    # first conflicting entry, and the matching one before it stays.
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    answer = follower.append(2, (2, 1), [e(2, 3, 1), e(9, 4, 2)], commit=4)
    assert answer["success"]
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 2)]
    assert follower.counter.values == [1, 2, 9]


def test_an_entry_conflicting_with_an_applied_one_is_refused(follower: Follower) -> None:
    e = follower.entry
    follower.append(1, (1, 0), [e(1, 2, 1), e(2, 3, 1), e(3, 4, 1)], commit=4)
    assert follower.counter.values == [1, 2, 3]
    # A leader whose log says entry 3 is another one: applied history cannot change.
    answer = follower.append(2, (2, 1), [e(7, 3, 2)], commit=4)
    assert not answer["success"]
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert follower.counter.values == [1, 2, 3]
    assert follower.sync.raft_info()["refused_append_entries"] == 1


def test_a_follower_syncs_its_journal_before_it_answers_success(
    follower: Follower, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        events.append("fdatasync")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    follower.transport.events = events
    follower.append(1, (1, 0), [follower.entry(1, 2, 1)], commit=1)
    assert events[:2] == ["fdatasync", "send next_node_idx"], events


def test_the_journal_survives_a_restart_and_a_compaction(tmp_path: Path) -> None:
    first = Follower(tmp_path)
    e = first.entry
    first.append(1, (1, 0), [e(i, i + 1, 1) for i in range(1, 30)], commit=30)
    assert first.counter.values == list(range(1, 30))
    first.sync.forceLogCompaction()
    for _ in range(3):
        first.sync.doTick(0.0)
    assert len(first.log()) == 2  # the rest is in the snapshot
    first.append(1, (30, 1), [e(30, 31, 1)], commit=31)
    first.close()

    again = Follower(tmp_path)  # same journal, dump and meta
    try:
        for _ in range(3):
            again.sync.doTick(0.0)
        assert again.log()[-1] == (31, 1)
        assert again.counter.values == list(range(1, 31))
        assert again.sync.raftCurrentTerm == 1
    finally:
        again.close()


def test_a_journal_pysyncobj_wrote_loads_and_a_torn_tail_is_dropped(tmp_path: Path) -> None:
    import struct

    from pysyncobj.journal import LAST_RECORD_OFFSET_OFFSET, FileJournal

    path = str(tmp_path / "journal")
    old = FileJournal(path)  # an existing replica's journal, from before
    for i in range(1, 6):
        old.add(b"\x01", i, 1)
    old.setCurrentTerm(3, "127.0.0.1:9")
    old._destroy()

    journal = DurableJournal(path)
    assert [(e[1], e[2]) for e in journal] == [(i, 1) for i in range(1, 6)]
    assert journal.getCurrentTerm() == 3 and journal.getVotedForNodeId() == "127.0.0.1:9"
    journal.add(b"\x01" * 100, 6, 3)
    journal.flush()
    journal._destroy()

    # Power lost while entry 6 was half on disk: its last bytes never made it.
    with open(path, "r+b") as f:
        f.seek(LAST_RECORD_OFFSET_OFFSET)
        end = struct.unpack("<I", f.read(4))[0]
        f.seek(end - 10)
        f.write(b"\0" * 10)
    torn = DurableJournal(path)
    assert [e[1] for e in torn] == [1, 2, 3, 4, 5]
    torn.add(b"\x01", 6, 3)  # and it goes on from the last whole record
    torn._destroy()
    assert [e[1] for e in DurableJournal(path)] == [1, 2, 3, 4, 5, 6]


def test_messages_are_stored_not_deflated_and_either_kind_is_read() -> None:
    """A replica's messages keep the zlib format (an earlier replica reads them) without
    deflating; what an earlier replica deflated is read as before."""
    raft.install()
    wire = ps_tcp.zlib
    message = ps_pickle.dumps({"type": "append_entries", "entries": [(b"x" * 2000, 7, 2)]})
    for data in (message, b"", message * 40):  # small ones framed here, a large one by zlib
        ours = wire.compress(data, 3)
        assert ours == zlib.compress(data, 0)  # stored blocks: nothing deflated
        assert zlib.decompress(ours) == data  # what an earlier replica's reader does
        assert wire.decompress(ours) == data
        assert wire.decompress(zlib.compress(data, 3)) == data  # an earlier replica's
    damaged = bytearray(wire.compress(message, 3))
    damaged[-1] ^= 1
    with pytest.raises(zlib.error):
        wire.decompress(bytes(damaged))


def test_an_entry_is_in_the_journal_once_flushed(tmp_path: Path) -> None:
    """The journal's end moves with the flush that makes its records durable: a record
    written and not flushed (never acknowledged) is not read back after a crash."""
    path = str(tmp_path / "journal")
    journal = DurableJournal(path)
    journal.add(b"one", 1, 1)
    journal.flush()
    journal.add(b"two", 2, 1)  # written, not flushed: the process dies here
    assert [e[1] for e in DurableJournal(path)] == [1]
    journal.flush()
    assert [e[1] for e in DurableJournal(path)] == [1, 2]
