"""The file-system Celery broker of the embedded platform.

It is kombu's `filesystem` transport with one change: a message file appears in the queue
folder only once it is complete. Kombu writes the file in place under an advisory lock
that the consumer never takes, so under load a worker can move and read half a message
and die on the JSON (seen with 200 jobs submitted back to back). Writing to a hidden
folder and renaming into place is atomic on one file system.

`register()` makes `filesystem://` broker URLs use this transport in the calling process;
the controller and the Celery app both call it before they connect.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from time import monotonic
from typing import Any

import orjson
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.json import dumps

INCOMING = ".incoming"  # no "<queue>.msg" suffix: the consumer's listing skips it


class Channel(filesystem.Channel):
    def _put(self, queue: Any, message: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        staging = folder / INCOMING
        staging.mkdir(exist_ok=True)
        partial = staging / name
        with open(partial, "wb") as f:
            f.write(_encode(message))
        os.replace(partial, folder / name)


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
    for sub in (base, base / "processed", base / "control", base / INCOMING):
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
