"""The controller's Raft journal and durable files: what pysyncobj leaves to the page cache.

- `DurableJournal` keeps pysyncobj's on-disk format (an existing journal still loads)
  but writes with pwrite and makes it durable with fdatasync: a follower syncs the
  entries of an AppendEntries before it answers success (a leader counts that answer
  toward the commit), and every replica syncs what it appended during a tick at the
  end of that tick, before the next tick counts its own log toward a commit.
- term and vote (the `.meta` file) are written to a temporary file, fsynced, renamed
  over, and the directory fsynced, before any vote or message that reflects them.
- compacting the log rewrites the journal to a new file and renames it over (pysyncobj
  rewrote it in place: a crash in the middle lost the log's tail).
- snapshots (pysyncobj's `Serializer`) are fsynced before the rename and the directory
  after it (`durable_replace`), so a snapshot is on disk before the log it replaces is
  dropped.

`scheduler/ctld/raft.py` installs these into pysyncobj (`install`), and `SpurSyncObj`
syncs the journal when the Raft rules say it must.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from typing import Any

import pysyncobj.pickle as ps_pickle
from pysyncobj.journal import (
    APP_NAME,
    APP_VERSION,
    FIRST_RECORD_OFFSET,
    JOURNAL_FORMAT_VERSION,
    LAST_RECORD_OFFSET_OFFSET,
    NAME_SIZE,
    VERSION_SIZE,
    Journal,
    MemoryJournal,
)

log = logging.getLogger(__name__)

_FIRST = int(FIRST_RECORD_OFFSET)  # where records start, after the header
_LAST_AT = int(LAST_RECORD_OFFSET_OFFSET)  # where the header keeps the end of the records


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_replace(src: str, dst: str) -> None:
    """Rename `src` over `dst` so that after a power loss `dst` holds either the old or
    the whole new content: fsync the file, rename, fsync the directory."""
    fd = os.open(src, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(src, dst)
    fsync_dir(dst)


def durable_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path)


def _header() -> bytes:
    name = APP_NAME + b"\0" * (NAME_SIZE - len(APP_NAME))
    version = APP_VERSION + b"\0" * (VERSION_SIZE - len(APP_VERSION))
    return bytes(name + version + struct.pack("<II", JOURNAL_FORMAT_VERSION, _FIRST))


def _record(command: bytes, idx: int, term: int) -> bytes:
    data = struct.pack("<QQ", idx, term) + bytes(ps_pickle.to_bytes(command))
    size = struct.pack("<I", len(data))
    return size + data + size


class DurableJournal(Journal):  # type: ignore[misc]
    """pysyncobj's journal file, written with pwrite and synced by `flush()`.

    Layout (pysyncobj's FileJournal, format 1): a 40-byte header whose last 4 bytes are
    the offset after the last record, then records `size, idx, term, command, size`. A
    record that does not read back whole (its two sizes differ, or it runs past the end
    of the file) ends the journal: it is a write that never reached the disk."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._meta_path = path + ".meta"
        self._lock = threading.Lock()
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []  # where each entry's record starts
        if not os.path.exists(path):
            durable_write(path, _header())
        self._fd = os.open(path, os.O_RDWR)
        self._end = self._load()
        self._dirty = False
        self._end_moved = False  # records appended since the header's end was written
        self._meta: dict[str, Any] = self._read_meta()
        self._meta_saved = True

    # -- reading it back -------------------------------------------------------------

    def _load(self) -> int:
        size = os.fstat(self._fd).st_size
        header = os.pread(self._fd, _FIRST, 0)
        if len(header) < _FIRST:
            os.pwrite(self._fd, _header(), 0)
            os.fsync(self._fd)
            return _FIRST
        last = int(struct.unpack("<I", header[_LAST_AT:])[0])
        offset = _FIRST
        while offset < min(last, size):
            head = os.pread(self._fd, 4, offset)
            if len(head) < 4:
                break
            length = int(struct.unpack("<I", head)[0])
            if length < 16 or offset + length + 8 > size:
                break
            body = os.pread(self._fd, length + 4, offset + 4)
            if len(body) < length + 4 or body[length:] != head:
                break
            idx, term = struct.unpack("<QQ", body[:16])
            self._entries.append((body[16:length], idx, term))
            self._offsets.append(offset)
            offset += length + 8
        if offset != last:
            log.warning(
                "raft journal %s: %d bytes after the last whole record ignored (a write "
                "that never reached the disk)",
                self._path,
                max(last - offset, 0),
            )
        return offset

    def _read_meta(self) -> dict[str, Any]:
        try:
            with open(self._meta_path, "rb") as f:
                meta = ps_pickle.loads(f.read())
        except (OSError, EOFError, ValueError, TypeError):
            return {}
        except Exception:  # a torn or foreign file: start as pysyncobj would, from {}
            log.exception("raft journal meta %s unreadable", self._meta_path)
            return {}
        return meta if isinstance(meta, dict) else {}

    # -- the Journal interface ----------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        # The header's end moves at the next flush, with the sync that makes the record
        # durable (one write a flush, not one an entry): until then the file ends where
        # the last flush left it, and a record written after it is not in the journal.
        record = _record(command, idx, term)
        with self._lock:
            os.pwrite(self._fd, record, self._end)
            self._entries.append((command, idx, term))
            self._offsets.append(self._end)
            self._end += len(record)
            self._end_moved = True
            self._dirty = True

    def _set_end(self, end: int) -> None:
        os.pwrite(self._fd, struct.pack("<I", end), _LAST_AT)
        self._end_moved = False
        self._dirty = True

    def clear(self) -> None:
        with self._lock:
            self._entries = []
            self._offsets = []
            self._end = _FIRST
            self._set_end(self._end)

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's name)
        with self._lock:
            if entryFrom >= len(self._entries):
                return
            self._end = self._offsets[entryFrom] if entryFrom >= 0 else _FIRST
            del self._entries[entryFrom:]
            del self._offsets[entryFrom:]
            self._set_end(self._end)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        """Drop the first `entryTo` entries (they are in a snapshot): write the rest to
        a new file and rename it over, so a crash leaves the old journal or the new one."""
        with self._lock:
            keep = self._entries[entryTo:]
            tmp = self._path + ".compact"
            offsets = []
            chunks = [_header()]
            offset = _FIRST
            for entry in keep:
                record = _record(*entry)
                offsets.append(offset)
                chunks.append(record)
                offset += len(record)
            data = bytearray(b"".join(chunks))
            data[_LAST_AT:_FIRST] = struct.pack("<I", offset)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
            fsync_dir(self._path)
            os.close(self._fd)
            self._fd = os.open(self._path, os.O_RDWR)
            self._entries = keep
            self._offsets = offsets
            self._end = offset
            self._end_moved = False
            self._dirty = False

    def flush(self) -> None:
        """Make every entry written so far durable (one fdatasync covers them all)."""
        with self._lock:
            if not self._dirty:
                return
            if self._end_moved:  # the records appended since: the header's end
                os.pwrite(self._fd, struct.pack("<I", self._end), _LAST_AT)
                self._end_moved = False
            self._dirty = False
            os.fdatasync(self._fd)

    @property
    def dirty(self) -> bool:
        return self._dirty

    def _destroy(self) -> None:
        self.flush()
        if not self._meta_saved:
            self._store_meta()
        with self._lock:
            os.close(self._fd)
            self._fd = -1

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        # Volatile state in Raft: stored once a second (onOneSecondTimer), only so that
        # a restarted replica re-applies its journal before it hears from a leader.
        if self._meta.get("raftCommitIndex") != raftCommitIndex:
            self._meta["raftCommitIndex"] = raftCommitIndex
            self._meta_saved = False

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        stored = int(self._meta.get("raftCommitIndex", 1))
        last = self._entries[-1][1] if self._entries else 1
        return min(stored, last)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        # Raft: term and vote are durable before any message that reflects them is sent.
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self._meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if not self._meta_saved:
            self._store_meta()

    def _store_meta(self) -> None:
        durable_write(self._meta_path, ps_pickle.dumps(self._meta))
        self._meta_saved = True


def create_journal(journal_file: str | None = None) -> Journal:
    if journal_file is None:
        return MemoryJournal()
    return DurableJournal(journal_file)
