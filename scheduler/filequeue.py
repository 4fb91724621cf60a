"""The file-system Celery broker of the embedded platform.

It is kombu's `filesystem` transport with one change: a message file appears in the queue
folder only once it is complete. Kombu writes the file in place under an advisory lock
that the consumer never takes, so under load a worker can move and read half a message
and die on the JSON (seen with 200 jobs submitted back to back). Writing to a hidden
folder and renaming into place is atomic on one file system.

The consumer lists the folder once for a burst, not once a message: kombu listed,
sorted and searched the whole folder at every `_get`, so a burst of N messages cost N
listings of up to N names. Here one listing is split by queue and kept; a queue lists
again only when what it was given has run out (as often as kombu when idle: holding a
listing back longer made a launch wait a polling interval more, ~15 ms at p50 in
`bench/e2e.py`). A message is claimed by renaming it into a hidden folder: of several
consumers, one rename wins and the others move on to the next name.

A message's file outlives it: once read, the consumer empties it and renames it into
`.spare`, and the next message written (by any process on the folder) is written over a
spare rather than into a new file. Making a file is what a message cost most on this
project's VMs (ext4: 0.5 ms of kernel CPU a file, a tenth of the controller's CPU a
job); writing over one costs a twentieth of that. There are never more spares than
messages that once waited at the same time. A message is read by file descriptor (open,
read, truncate, close: half the system calls of Python's buffered file, 12 µs of CPU a
message less) and decoded by orjson where orjson wrote it (kombu's decoder: 9 µs for a
launch's message, orjson 3 µs).

`register()` makes `filesystem://` broker URLs use this transport in the calling process;
the controller and the Celery app both call it before they connect.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections import deque
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

import orjson
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.json import dumps, loads

INCOMING = ".incoming"  # no "<queue>.msg" suffix: the consumer's listing skips it
CLAIMED = ".claimed"  # where a consumer renames the message it takes
SPARE = ".spare"  # read messages' files, emptied, for the next message to be written into

# A message's name sorts in the order it was sent: the millisecond clock (zero-padded, so
# that the listing's string sort stays right when it gains a digit), then this process's
# count of messages, so that one sender's messages within a millisecond keep their order
# (kombu's names ended in a uuid there, and two launches sent in one millisecond arrived
# in either order). Senders in different processes are ordered by the clock alone.
_sent = itertools.count()


class Channel(filesystem.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._pending: dict[str, deque[str]] = {}  # queue -> names from the last listing
        self._spares: deque[str] = deque()  # names in SPARE from its last listing

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        pending = self._pending.get(queue)
        if not pending:
            self._list()
            pending = self._pending.get(queue)
        folder = self.data_folder_in
        claimed = os.path.join(folder, CLAIMED)
        while pending:
            name = pending.popleft()
            mine = os.path.join(claimed, name)
            try:
                os.rename(os.path.join(folder, name), mine)
            except FileNotFoundError:
                continue  # another consumer took it
            payload = _read_and_empty(mine)
            try:
                os.rename(mine, os.path.join(folder, SPARE, name))
            except FileNotFoundError:  # no spare folder (not made by `transport_options`)
                os.remove(mine)
            return _decode(payload)
        raise Empty()

    def _list(self) -> None:
        """One listing of the folder, oldest first (see `_sent`), split by queue."""
        pending: dict[str, deque[str]] = {}
        for name in sorted(os.listdir(self.data_folder_in)):
            rest = name.partition(".")[2]  # "<ms>_<count>_<uuid>.<queue>.msg"
            if rest.endswith(".msg"):
                pending.setdefault(rest[:-4], deque()).append(name)
        self._pending = pending

    def _put(self, queue: Any, message: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{round(monotonic() * 1000):015d}_{next(_sent):012d}_{uuid.uuid4()}.{queue}.msg"
        folder = self.data_folder_out
        partial = os.path.join(folder, INCOMING, name)
        body = _encode(message)
        self._take_spare(partial)
        try:
            _write(partial, body)
        except FileNotFoundError:  # `transport_options` makes the folder; other setups not
            os.makedirs(os.path.dirname(partial), exist_ok=True)
            _write(partial, body)
        os.replace(partial, os.path.join(folder, name))

    def _take_spare(self, path: str) -> None:
        """Move a spare file to `path` (written over next), if there is one: on some file
        systems making a file costs twenty times what writing over one does (ext4 in
        this project's VMs: 0.5 ms of kernel CPU, against 25 µs), and each message is a
        file. Of several processes, one rename takes a spare and the others move on."""
        spares = self._spares
        folder = os.path.join(self.data_folder_out, SPARE)
        for attempt in range(2):
            while spares:
                try:
                    os.rename(os.path.join(folder, spares.popleft()), path)
                    return
                except FileNotFoundError:
                    continue  # another process took it (or the folder is not there)
            if attempt == 0:
                try:
                    spares.extend(os.listdir(folder))
                except FileNotFoundError:
                    return


def _write(path: str, body: bytes) -> None:
    """`body` into the file at `path`: a spare (empty, `_read_and_empty`) or a new file.
    Opened without O_TRUNC: ext4 marks a file truncated to nothing (by O_TRUNC too, even
    when it is empty already) and, at its close, starts writing its new blocks back
    (auto_da_alloc, for editors that rewrite in place): 80 µs of the sender's CPU a
    message. A file longer than `body` (none should be) is cut to it after the write."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)  # as open(path, "wb")
    try:
        written = os.write(fd, body)
        if written < len(body):  # a short write (a signal, a full disk): the rest
            view = memoryview(body)
            while written < len(body):
                written += os.write(fd, view[written:])
        if os.fstat(fd).st_size > written:
            os.ftruncate(fd, written)
    finally:
        os.close(fd)


READ_SIZE = 1 << 16  # a launch batch's message is a few KiB; bigger ones read in turns


def _read_and_empty(path: str) -> bytes:
    """The file's bytes, the file left empty (a spare keeps no message). By file
    descriptor: Python's buffered file took twice the system calls (its fstat and seeks)
    of reading a file that is whole before anyone can open it (`_put` renames it in
    complete): a read shorter than asked for is its end."""
    fd = os.open(path, os.O_RDWR)
    try:
        chunks = [os.read(fd, READ_SIZE)]
        while len(chunks[-1]) == READ_SIZE:
            chunks.append(os.read(fd, READ_SIZE))
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _decode(payload: bytes) -> Any:
    """A message file's JSON, by orjson (kombu's decoder calls a Python hook for every
    object in it) where orjson wrote it; by kombu's where kombu's encoder did (`_encode`'s
    fallback, or an older sender): it may hold what orjson would read otherwise (a type
    JSON lacks, marked "__type__"; an integer beyond 64 bits, which orjson reads as a
    float). Told apart by the first key's colon: orjson writes no space after it, kombu's
    encoder (the json module's separators) always one; a message is an object whose keys
    are kombu's, never holding a quote."""
    colon = payload.find(b'":')
    if colon < 0 or payload[colon + 2 : colon + 3] == b" ":
        return loads(payload)  # type: ignore[no-untyped-call]
    return orjson.loads(payload)


def _encode(message: Any) -> bytes:
    """The message file: JSON by orjson (kombu's encoder took as long as the task's own
    body), or by kombu's encoder for a type orjson does not encode."""
    try:
        return orjson.dumps(message)
    except TypeError:
        return str(dumps(message)).encode()  # type: ignore[no-untyped-call]


class Transport(filesystem.Transport):
    Channel = Channel


def register() -> None:
    TRANSPORT_ALIASES["filesystem"] = f"{__name__}:Transport"


def transport_options(folder: str | os.PathLike[str], *, polling_interval: float) -> dict[str, Any]:
    """Broker options for a queue folder shared by the controller and the workers:
    messages in the folder itself, processed/ and control/ beneath it."""
    base = Path(folder)
    for sub in (
        base,
        base / "processed",
        base / "control",
        base / INCOMING,
        base / CLAIMED,
        base / SPARE,
    ):
        sub.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(base),
        "data_folder_out": str(base),
        "processed_folder": str(base / "processed"),
        # kombu's default is ./control, relative to wherever the process runs.
        "control_folder": str(base / "control"),
        "store_processed": False,
        "polling_interval": polling_interval,
    }
