"""The controller: a Raft replica of the `ClusterState`, plus what only the leader does.

The controller *has* a state (through its `Replica`); it is not one. The leader:
- plans and commits a scheduling pass when something changed that may let a job start
  (or every second): one pass for a burst, once the commands queued with the change
  are committed (`PASS_DEBOUNCE_S` at most), and at most one every
  `pass_min_interval_s` (its config) under a stream of changes; a submission that
  cannot start now (held, waiting on a dependency or its begin time) wakes nothing,
- dispatches effects after commit, and on election re-derives the ones in flight,
- once a second, not on every pass: marks nodes down that stop heartbeating and ends
  jobs past their time limit; every `PURGE_INTERVAL_S`, forgets jobs that ended more
  than `min_job_age_s` ago,
- takes the heartbeats (a follower refuses them with 503 `not_leader`, so the agents'
  clients move on to the leader), and reconciles each with what it believes runs on
  that node.
Liveness (when each agent was last heard from, which jobs went missing from its
heartbeats since when) is leader-local memory, not replicated: a replica that becomes
the leader starts every node's clock afresh, a full timeout of grace (docs/architecture.md,
"Liveness, reports and fencing").

The API's writes are coroutines that await their commit on the event loop
(`Replica.commit_async`): no thread waits per command, and nothing here that runs on the
event loop takes the replica's lock (which the Raft thread needs to apply); the reads
(`jobs`, `job`, `nodes`, ...) take it, so the API runs them in its thread pool.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from scheduler.client import JobReport
from scheduler.config import ControllerConfig, SpurConfig
from scheduler.core import commands as c
from scheduler.core.contract import HOLDS_RESOURCES, JobSpec
from scheduler.core.effects import Effect, Emit
from scheduler.core.errors import Rejected
from scheduler.core.planner import plan_pass
from scheduler.core.resources import NodeSpec
from scheduler.core.time_limits import job_time_limit
from scheduler.ctld import sweeps
from scheduler.ctld.dispatch import Dispatcher, broker_app
from scheduler.ctld.metrics import PassStats
from scheduler.ctld.reads import JobReads
from scheduler.ctld.replica import InsecureGroup, Replica, Submitted
from scheduler.rpc import signatures
from scheduler.rpc.errors import Refused, Unavailable

log = logging.getLogger(__name__)

MIN_JOB_AGE_S = 300.0  # as Slurm's MinJobAge default: ended jobs stay visible 5 minutes
# What may let a job start, or must end one: a scheduling pass follows. A submission
# wakes it only when one of its jobs can start now (`_startable`).
WAKING_COMMANDS = (
    c.JobFinished,
    c.JobVanished,
    c.CancelJob,
    c.ReleaseJob,
    c.RegisterNode,
    c.ResumeNode,
    c.NodeLost,
)
PASS_INTERVAL_S = 1.0  # a pass at least this often (begin times come due, limits, ...)
# After a wake, how long a pass waits at most for the commands queued with the change
# to commit: a burst of submissions is planned by one pass, not one per log entry.
PASS_DEBOUNCE_S = 0.005
SWEEP_INTERVAL_S = 1.0  # liveness and time limits: a job ends at most this late
PURGE_INTERVAL_S = 10.0  # ended jobs are forgotten min_job_age_s after, this late at most
NOT_LEADER = "not_leader"  # the code of a follower's 503 to a heartbeat


# Command ids: this process's random half, then a count. Unique across replicas and
# restarts as uuid4 is (64 random bits per process), without a getrandom call per
# command on the event loop (each one a GIL release the Raft thread takes over).
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNT = itertools.count(1)


def new_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNT):016x}"


def signing_key(ctl: ControllerConfig) -> bytes:
    """The key launches are signed with: configured (a group shares one), or, for a lone
    replica, kept in its state directory (mode 0600)."""
    if ctl.signing_key:
        return ctl.signing_key.encode()
    if ctl.raft_peers:
        raise InsecureGroup(
            "a controller with raft_peers needs signing_key_file (or SPUR_SIGNING_KEY): "
            "the replicas must sign launches with one key"
        )
    path = Path(ctl.state_dir) / "signing-key"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip().encode()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path.read_text().strip().encode()


class Controller:
    def __init__(self, config: SpurConfig, *, dispatcher: Dispatcher | None = None) -> None:
        self.config = config
        ctl = config.controller
        self.signing_key = signing_key(ctl)
        self._dispatcher = dispatcher or Dispatcher(
            broker_app(ctl.broker_url, ctl.broker_folder),
            cluster=config.cluster_name,
            kill_wait_s=ctl.kill_wait_s,
            signing_key=self.signing_key,
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._needs_reconcile = threading.Event()
        self._last_seen: dict[str, float] = {}
        # Per node: the jobs it should run (their start was reported) that its heartbeats
        # stopped listing, and since when (monotonic).
        self._missing: dict[str, dict[tuple[int, int], float]] = {}
        self._seen_lock = threading.Lock()
        self._leading_since: float | None = None  # when this replica last became the leader
        # What the entry being applied (Raft thread) asks of the leader: its effects, and
        # whether a pass should follow.
        self._applied_effects: list[Effect] = []
        self._applied_wakes = False
        self.reads = JobReads()
        self.replica = Replica(
            address=ctl.raft_address,
            peers=list(ctl.raft_peers),
            state_dir=ctl.state_dir,
            password=ctl.raft_password,
            on_effects=self._on_effects,
            on_leader_change=self._on_leader_change,
            job_view=self.reads.job_view,
            on_applied=self._on_applied,
        )
        self.reads.attach(self.replica)
        self.jobs = self.reads.jobs
        self.job_columns = self.reads.job_columns
        self.job = self.reads.job
        self.pass_stats = PassStats()  # /metrics: how long scheduling passes take
        self._loop = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._dispatcher.start()
        self._loop.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._loop.join(timeout=5)
        self.replica.destroy()
        self._dispatcher.stop()

    def wait_ready(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.replica.is_ready and self.replica.leader_address:
                return True
            time.sleep(0.05)
        return False

    # -- commands from the API ------------------------------------------------------

    async def submit(self, spec: JobSpec, *, idempotency_key: str = "") -> Submitted:
        """The new job's id and its view (its first task, for an array), as the apply
        left it."""
        self._check_time_limit(spec)
        result: Submitted = await self.replica.commit_async(
            c.SubmitJob(idempotency_key or new_id(), time.time(), spec), view=True
        )
        return _with_spec(result, spec)

    async def submit_all(self, specs: Sequence[tuple[JobSpec, str]]) -> list[Submitted | Rejected]:
        """Several submissions (spec, idempotency key) committed together, in one log
        entry where they fit: each one's `Submitted`, or the refusal that refused it
        alone."""
        now = time.time()
        results: list[Submitted | Rejected | None] = []
        commands = []
        for spec, key in specs:
            try:
                self._check_time_limit(spec)
            except Rejected as exc:
                results.append(exc)
                continue
            results.append(None)
            commands.append(c.SubmitJob(key or new_id(), now, spec))
        committed = iter(
            await self.replica.commit_all_async(commands, view=True) if commands else []
        )
        out: list[Submitted | Rejected] = []
        for (spec, _), result in zip(specs, results, strict=True):
            if result is None:
                result = next(committed)
                if not isinstance(result, Rejected):
                    result = _with_spec(result, spec)
            out.append(result)
        return out

    def _check_time_limit(self, spec: JobSpec) -> None:
        """Refuses, before the Raft log, a time limit the job's partition does not allow
        (the state machine would refuse it too, but only once it took a log entry). An
        unknown partition is left to the state machine's own refusal. Reads the
        partitions the last apply published: no lock, so the event loop may call it."""
        view = self.replica.partitions
        part = view.partitions.get(spec.partition or view.default or "")
        if part is not None:
            job_time_limit(part, spec.time_limit_min)

    async def act(self, request: c.ActionRequest) -> None:
        """One of the contract's job actions (scancel, scontrol hold/release/requeue)."""
        await self.replica.commit_async(c.action_command(new_id(), time.time(), request))

    async def update(
        self, job_id: int, changes: tuple[tuple[str, Any], ...], *, admin: bool
    ) -> None:
        """scontrol update: change a pending job's UPDATE_FIELDS (checked at the edge)."""
        await self.replica.commit_async(
            c.UpdateJob(new_id(), time.time(), job_id, changes, admin=admin)
        )

    async def drain_node(self, node: str, *, reason: str, by: str) -> None:
        """scontrol update NodeName=x State=DRAIN Reason=...: no new job goes there."""
        await self.replica.commit_async(c.DrainNode(new_id(), time.time(), node, reason, by=by))

    async def resume_node(self, node: str, *, by: str) -> None:
        """State=RESUME: the node takes jobs again."""
        await self.replica.commit_async(c.ResumeNode(new_id(), time.time(), node, by=by))

    def node(self, name: str) -> dict[str, Any] | None:
        return next((n for n in self.nodes() if n["name"] == name), None)

    def register(self, node: NodeSpec) -> None:
        self.replica.commit(c.RegisterNode(new_id(), time.time(), node))
        if self.replica.is_leader:
            self._saw(node.name)

    def credential_for(self, node: str, proof: str) -> str:
        """The node's credential (hex), for a node that registers for the first time or
        proves it holds it; Refused (403) for anyone else claiming a known node's name."""
        credential = signatures.node_key(self.signing_key, node)
        with self.replica.lock:
            known = node in self.replica.state.nodes
        expected = signatures.registration_proof(credential, node)
        if known and not hmac.compare_digest(proof, expected):
            raise Refused(
                f"node {node} is registered: its agent must prove it holds the node's "
                "credential (an operator can provision it: spurctld --print-credential NODE)",
                code="credential_required",
                status=403,
            )
        return credential.hex()

    async def report(self, r: JobReport) -> None:
        """An agent's report that a job started or finished on its node."""
        await self.replica.commit_async(self._report_command(r, time.time()))

    async def report_all(self, reports: Sequence[JobReport]) -> list[Rejected | None]:
        """An agent's queued reports, committed together in order: for each, None or
        the refusal that refused it alone."""
        now = time.time()
        commands = [self._report_command(r, now) for r in reports]
        results = await self.replica.commit_all_async(commands)
        return [r if isinstance(r, Rejected) else None for r in results]

    @staticmethod
    def _report_command(r: JobReport, now: float) -> c.Command:
        if r.kind == "started":
            return c.JobStarted(new_id(), now, r.job_id, r.attempt, r.node, r.pid, r.limits)
        return c.JobFinished(
            new_id(), now, r.job_id, r.attempt, r.node, r.exit_code, r.signal, r.reason, r.oom
        )

    def heartbeat(self, node: str, running: Iterable[tuple[int, int]]) -> dict[str, Any]:
        """Note the agent is alive; bring a node that was marked down back; tell the agent
        which of its processes the cluster no longer knows (they must be killed) and how
        long its lease runs; end the jobs that vanished from it without a report.

        The leader's alone: a follower's clock would not count (503 `not_leader`)."""
        if not self.replica.is_leader:
            raise Unavailable(self._not_leader(), code=NOT_LEADER)
        self._saw(node)
        listed = set(running)
        with self.replica.lock:
            state = self.replica.state
            known = state.nodes.get(node)
            spec = known.spec if known is not None and not known.up else None
            kill = []
            for job_id, attempt in sorted(listed):
                job = state.jobs.get(job_id)
                if (
                    job is None
                    or job.attempt != attempt
                    or node not in job.allocation
                    or job.state.is_terminal
                ):
                    kill.append({"job_id": job_id, "attempt": attempt})
            # The other way round: what should run here (its batch script, whose start
            # was reported) and is not listed.
            missing = set()
            for job_id in known.jobs if known is not None else ():
                job = state.jobs[job_id]
                if (
                    job.state in HOLDS_RESOURCES
                    and job.pid is not None
                    and job.nodes[0] == node
                    and (job_id, job.attempt) not in listed
                ):
                    missing.add((job_id, job.attempt))
        vanished = self._note_missing(node, missing)
        if spec is not None:
            self.register(spec)
        for job_id, attempt in vanished:
            log.warning(
                "job %s.%s vanished from node %s without a report: ending it",
                job_id,
                attempt,
                node,
            )
            self.replica.commit(
                c.JobVanished(
                    new_id(),
                    time.time(),
                    job_id,
                    attempt,
                    node,
                    "the job vanished from its node without a report of its end",
                )
            )
        ctl = self.config.controller
        with self.replica.lock:
            current = self.replica.state.nodes.get(node)
            epoch = current.epoch if current is not None else 0
        return {
            "kill": kill,
            "registered": known is not None,
            "lease_s": ctl.lease_s,
            "epoch": epoch,  # launches made before it are stale (Node.epoch)
        }

    def _note_missing(self, node: str, missing: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """Keep when each missing job was first missed; those missed for longer than the
        grace (its report, resent from the agent's outbox, would have come) have vanished."""
        now = time.monotonic()
        grace = self.config.controller.report_grace_s
        with self._seen_lock:
            before = self._missing.get(node, {})
            since = {key: before.get(key, now) for key in missing}
            vanished = sorted(key for key, t in since.items() if now - t >= grace)
            for key in vanished:
                del since[key]
            if since:
                self._missing[node] = since
            else:
                self._missing.pop(node, None)
        return vanished

    def _not_leader(self) -> str:
        leader = self.replica.leader_address
        url = dict(self.config.controller.raft_http).get(leader, "")
        where = f"the leader is {url or leader}" if leader else "no leader is elected"
        return f"this replica is not the leader: {where}"

    # -- reads ------------------------------------------------------------------------
    # The job reads (`jobs`, `job_columns`, `job`) are `reads.JobReads`'s.

    def nodes(self) -> list[dict[str, Any]]:
        with self.replica.lock:
            state = self.replica.state
            out = []
            for name, node in sorted(state.nodes.items()):
                data = node.to_dict()
                data["partitions"] = state.node_partitions(name)
                out.append(data)
        with self._seen_lock:
            for data in out:
                data["last_seen"] = self._last_seen.get(data["name"])
        return out

    def policy(self) -> dict[str, Any]:
        """Accounts' shares and usage, the QoS table and the priority weights (sshare,
        sacctmgr, sprio -w): `scheduler.core.shares.policy_report`."""
        from scheduler.core.shares import policy_report

        with self.replica.lock:
            report = policy_report(self.replica.state, time.time())
        report["min_job_age_s"] = MIN_JOB_AGE_S
        report["cluster_name"] = self.config.cluster_name
        return report

    def partitions(self) -> list[dict[str, Any]]:
        with self.replica.lock:
            state = self.replica.state
            return [
                {
                    "name": p.name,
                    "default": p.name == state.default_partition,
                    "state": "up",
                    "max_time_min": p.max_time_min,
                    "default_time_min": p.default_time_min,
                    "nodes": [n.name for n in state.partition_nodes(p.name)],
                }
                for p in state.partitions.values()
            ]

    # -- leader work --------------------------------------------------------------------

    def _on_effects(self, command: c.Command, effects: list[Effect]) -> None:
        # Runs on the Raft thread of every replica; only the leader acts, once the
        # entry's commands are all applied (`_on_applied`): one hand-over a log entry.
        if not self.replica_is_leader():
            return
        self._applied_effects += effects
        if isinstance(command, WAKING_COMMANDS) or (
            isinstance(command, c.SubmitJob) and _startable(effects)
        ):
            self._applied_wakes = True

    def _on_applied(self) -> None:
        # The Raft thread, after each entry: its effects to the dispatcher together.
        effects, self._applied_effects = self._applied_effects, []
        if effects:
            self._dispatcher.submit(effects)
        if self._applied_wakes:
            self._applied_wakes = False
            self._wake.set()

    def replica_is_leader(self) -> bool:
        # The consumer applies entries during Replica.__init__ (journal replay), before
        # self.replica exists; nothing is dispatched then, as no replica leads yet.
        replica = getattr(self, "replica", None)
        return replica is not None and replica.is_leader

    def _on_leader_change(self, leading: bool) -> None:
        log.info("this replica %s the leader", "is now" if leading else "is no longer")
        # Whatever this replica heard before (as a follower, or in an earlier term as the
        # leader) is stale: every node's clock starts afresh, a full node_timeout_s, and
        # so does every missing job's grace. The controller's own downtime never counts
        # against the agents.
        with self._seen_lock:
            self._last_seen.clear()
            self._missing.clear()
            self._leading_since = time.monotonic() if leading else None
        if leading:
            self._needs_reconcile.set()
            self._wake.set()
        else:
            self.reads.forget()

    def _saw(self, node: str) -> None:
        with self._seen_lock:
            self._last_seen[node] = time.monotonic()

    def _run(self) -> None:
        next_sweep = next_purge = 0.0  # monotonic
        last_pass = float("-inf")  # monotonic: when the last pass started
        least = self.config.controller.pass_min_interval_s
        while not self._stop.is_set():
            self._wake.wait(timeout=PASS_INTERVAL_S)
            # Under a stream of changes, a pass at most every `least` seconds: the
            # changes that come meanwhile wait for it (a wake then is kept, not lost).
            # A new leader's first (its reconciliation: the partitions, the effects in
            # flight) waits for nothing.
            wait = 0.0 if self._needs_reconcile.is_set() else last_pass + least - time.monotonic()
            if self._stop.wait(max(0.0, wait)):
                return
            # Let the commands that came with the change commit first: one pass then
            # plans them all, instead of one pass per log entry of a burst.
            self.replica.wait_idle(PASS_DEBOUNCE_S)
            self._wake.clear()
            if not self.replica.is_leader:
                continue
            last_pass = time.monotonic()
            try:
                if self._needs_reconcile.is_set():
                    self._reconcile()
                with self.pass_stats.timed():
                    self._schedule()
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + SWEEP_INTERVAL_S
                    self._enforce_liveness()
                    sweeps.end_overdue_jobs(self.replica, new_id)
                if now >= next_purge:
                    next_purge = now + PURGE_INTERVAL_S
                    sweeps.forget_ended_jobs(self.replica, new_id, MIN_JOB_AGE_S)
            except Exception:  # a lost leadership or a timeout: the next pass retries
                log.exception("scheduling pass failed")

    def _reconcile(self) -> None:
        wanted = self.config.partitions
        with self.replica.lock:
            current = tuple(self.replica.state.partitions.values())
            policy = self.replica.state.policy
        if current != wanted:
            self.replica.commit(c.ConfigurePartitions(new_id(), time.time(), wanted))
        # Policy, like partitions, is replicated state: the leader commits its config.
        if policy != self.config.policy:
            self.replica.commit(c.ConfigurePolicy(new_id(), time.time(), self.config.policy))
        with self.replica.lock:
            redo = self.replica.state.redo_effects()
        self._dispatcher.submit(redo)
        self._needs_reconcile.clear()
        log.info("reconciled: %d effects re-dispatched", len(redo))

    def _schedule(self) -> None:
        estimate = self.reads.estimate_due()  # squeue --start's, every few seconds
        with self.replica.lock:
            plan = plan_pass(
                self.replica.state, now=time.time(), cmd_id=new_id(), estimate=estimate
            )
        # Leader-local, like liveness: what sprio and squeue --start show is the last
        # pass's view. A pass that outlived the leadership keeps no estimate (the change
        # may have forgotten them while it ran).
        self.reads.keep(plan)
        if not self.replica.is_leader:
            self.reads.forget()
        if plan.allocate is not None:
            self.replica.commit(plan.allocate)
        preempt = list(plan.preempt)
        for command, result in zip(preempt, self.replica.commit_all(preempt), strict=True):
            if isinstance(result, Rejected):  # the state moved on since the plan: next pass
                log.info("preemption %s not applied: %s", command.cmd_id, result.message)

    def _enforce_liveness(self) -> None:
        now = time.monotonic()
        cutoff = now - self.config.controller.node_timeout_s
        with self.replica.lock:
            up = [n for n, node in self.replica.state.nodes.items() if node.up]
        with self._seen_lock:
            since = self._leading_since
            if since is None:
                return  # leading, but the change is not announced yet: no clock is fresh
            lost = [n for n in up if max(self._last_seen.get(n, since), since) < cutoff]
        for name in lost:
            log.warning("node %s stopped heartbeating; marking it down", name)
            self.replica.commit(c.NodeLost(new_id(), time.time(), name, "Not responding"))


def _with_spec(submitted: Submitted, spec: JobSpec) -> Submitted:
    """The submission's view with its spec (the apply's is its event's job dict)."""
    job = submitted.job
    if job is None or "spec" in job:
        return submitted
    return Submitted(submitted.job_id, {**job, "spec": spec.to_dict()})


def _startable(effects: Sequence[Effect]) -> bool:
    """Whether a submission's jobs include one that may start now: its `submitted` event
    gives no reason it waits whatever the resources (held, a dependency, a begin time,
    the array's throttle: `ClusterState.blocked_reason`)."""
    return any(
        isinstance(e, Emit) and e.kind == "submitted" and e.job.get("reason") == "None"
        for e in effects
    )
