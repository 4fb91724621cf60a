"""The agent's side of node membership: register with the controller, then heartbeat.

Registration is retried until a controller answers, because agents and controllers start
in any order. Each heartbeat reports what runs here, and the answer lists what the
controller does not know (jobs it cancelled or already gave up on): those are killed.
A heartbeat answered 404 means the controller forgot this node (its state was reset):
register again rather than heartbeat into the void.

Heartbeats go to the leader (a follower answers 503 and the client moves on, then stays
with the leader). The first one is sent right after registering. Each one the leader
acknowledges renews the node's fencing lease from the moment it was sent
(agents/supervisor.py), and `on_contact` passes the lease on to the jobs' supervisors
and tells the report queue to retry now.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from agents.credentials import NodeCredential
from agents.supervisor import Lease
from scheduler.core.resources import NodeSpec
from scheduler.rpc.errors import NotFound, Refused, RpcError, Unavailable

log = logging.getLogger(__name__)


class Membership(Protocol):
    """The part of `ControllerClient` the agent's membership uses."""

    def register_node(self, node: dict[str, Any], *, proof: str = "") -> dict[str, Any]: ...

    def heartbeat(
        self, node: str, running: list[dict[str, int]], *, timeout_s: float | None = None
    ) -> dict[str, Any]: ...


class Jobs(Protocol):
    """The part of `Launcher` the heartbeat reads and acts on."""

    def running(self) -> list[dict[str, int]]: ...

    def signal(
        self, job_id: int, attempt: int, signum: int, *, kill_after_s: float | None = None
    ) -> bool: ...


class NodeMembership:
    def __init__(
        self,
        *,
        node: NodeSpec,
        controller: Membership,
        jobs: Jobs,
        credential: NodeCredential | None = None,
        heartbeat_interval_s: float = 5.0,
        max_backoff_s: float = 30.0,
        lease: Lease | None = None,
        on_contact: Callable[[], None] | None = None,
        ending: Callable[[], Iterable[tuple[int, int]]] = tuple,
    ) -> None:
        self.node = node
        self._ending = ending
        self.lease = lease
        self._on_contact = on_contact
        self.credential = credential
        self.interval = heartbeat_interval_s
        self._controller = controller
        self._jobs = jobs
        self._max_backoff = max_backoff_s
        self.registered = threading.Event()

    def register(self, stop: threading.Event) -> bool:
        """Register, retrying with backoff; False if `stop` was set first."""
        backoff = 0.5
        while not stop.is_set():
            try:
                proof = self.credential.proof() if self.credential is not None else ""
                answer = self._controller.register_node(self.node.to_dict(), proof=proof)
            except Unavailable as exc:
                log.warning("controller not reachable (%s); retry in %.1fs", exc, backoff)
            except Refused:
                # The controller read our description and refused it: retrying the
                # same description cannot help, and running unregistered is useless.
                raise
            except RpcError as exc:
                log.warning("registration failed (%s); retry in %.1fs", exc, backoff)
            else:
                credential = answer.get("credential")
                if self.credential is not None and isinstance(credential, str):
                    self.credential.store(credential)
                interval = answer.get("heartbeat_interval_s")
                if isinstance(interval, int | float) and interval > 0:
                    self.interval = float(interval)
                self.registered.set()
                log.info(
                    "registered node %s (%d GPUs); heartbeat every %.1fs",
                    self.node.name,
                    len(self.node.gpus),
                    self.interval,
                )
                return True
            stop.wait(backoff)
            backoff = min(backoff * 2, self._max_backoff)
        return False

    def heartbeat(self) -> None:
        """One heartbeat; kills what the controller lists. Raises what the call raises."""
        listed = {(j["job_id"], j["attempt"]) for j in self._jobs.running()}
        listed.update(self._ending())  # ended here, its report not yet acknowledged
        running = [{"job_id": job_id, "attempt": attempt} for job_id, attempt in sorted(listed)]
        sent_at = time.monotonic()
        # Each replica gets two intervals: a paused or wedged one (its socket accepts,
        # nothing answers) must not hold the heartbeat until the node times out.
        answer = self._controller.heartbeat(
            self.node.name, running, timeout_s=max(1.0, 2 * self.interval)
        )
        lease_s, epoch = answer.get("lease_s"), answer.get("epoch", 0)
        if self.lease is not None and isinstance(lease_s, int | float) and lease_s > 0:
            self.lease.renew(
                sent_at=sent_at,
                lease_s=float(lease_s),
                epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0,
            )
        if self._on_contact is not None:
            self._on_contact()
        for job in answer.get("kill", ()):
            try:
                job_id, attempt = int(job["job_id"]), int(job["attempt"])
            except (KeyError, TypeError, ValueError):
                log.warning("ignoring malformed kill entry %r", job)
                continue
            log.warning("controller does not know job %s.%s: killing it", job_id, attempt)
            self._jobs.signal(job_id, attempt, signal.SIGKILL)

    def run(self, stop: threading.Event) -> None:
        """Register, then heartbeat until `stop` is set."""
        if not self.register(stop):
            return
        first = True  # at once after registering: the lease starts with it
        while first or not stop.wait(self.interval):
            first = False
            try:
                self.heartbeat()
            except Unavailable as exc:
                log.warning("heartbeat not delivered: %s", exc)
            except NotFound:
                log.warning("controller forgot node %s: registering again", self.node.name)
                self.registered.clear()
                if not self.register(stop):
                    return
                first = True
            except RpcError as exc:
                log.warning("heartbeat refused: %s", exc)
