"""This node's credential: the key the controller signs its launches and signals with
(scheduler/rpc/signatures.py), received when the node first registers, or provisioned
by an operator (`spurctld --print-credential NODE`), and kept in the spool (mode 0600).

Until the agent holds it, it runs nothing: a launch is answered 503, which the worker
retries until the node has registered.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from scheduler.rpc.signatures import registration_proof


class NodeCredential:
    def __init__(self, path: Path, node: str) -> None:
        self.path = path
        self.node = node
        self._lock = threading.Lock()
        self._key: bytes | None = None
        try:
            self._key = bytes.fromhex(path.read_text().strip())
        except (OSError, ValueError):
            self._key = None

    @property
    def key(self) -> bytes | None:
        with self._lock:
            return self._key

    def proof(self) -> str:
        """What shows the controller that this agent holds the node's credential."""
        key = self.key
        return registration_proof(key, self.node) if key is not None else ""

    def store(self, hex_key: str) -> None:
        key = bytes.fromhex(hex_key)
        with self._lock:
            if key == self._key:
                return
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(hex_key + "\n")
            os.replace(tmp, self.path)
            self._key = key
