"""Every edge a job may take between states, in one table: `(from, to) -> handler`.

`ClusterState.transition(job, to, now, **details)` is the only way a job changes state.
Command handlers decide *which* transition a stimulus means (a cancel of a running job
is RUNNING -> COMPLETING, a report of its end COMPLETING -> CANCELLED); the handler of
the edge does what every such move does (take or give back resources, stamp times,
count array tasks, charge fair share, emit the event). An edge missing from the table
is a bug, never a user error: a stale or duplicated report is turned away before it
gets here, so replicas cannot diverge on it.

This is a mixin of `ClusterState` (its own methods, kept in their own file); the
attributes it declares below are all it reads of the state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from scheduler.core.contract import HOLDS_RESOURCES, JobState
from scheduler.core.effects import Effect, Emit, Launch, Signal
from scheduler.core.jobs import Job, NodeAlloc
from scheduler.core.nodes import Node
from scheduler.core.policy import Policy
from scheduler.core.steps import end_running_steps

SIGKILL = 9
SIGTERM = 15
# scontrol suspend and resume (Linux's numbers; the agent freezes or thaws the job's
# cgroup instead where it has one).
SIGCONT = 18
SIGSTOP = 19

Handler = Callable[..., list[Effect]]

P, R, CG, S = JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.SUSPENDED
# A job that is stopping (COMPLETING) ends in the state chosen when it was stopped.
STOPPED_INTO = (
    JobState.CANCELLED,
    JobState.TIMEOUT,
    JobState.PREEMPTED,
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.NODE_FAIL,
)


class JobTransitions:
    nodes: dict[str, Node]
    policy: Policy
    array_active: dict[int, int]
    waiting: dict[str, int]
    usage_gpu_s: dict[str, tuple[float, float]]
    seq: int
    _cmd_id: str
    # Whether an event carries the job's dict (`Emit.job`). Only the leader sends events
    # (and answers a submission with its event's dict): a follower's replica turns this
    # off and skips the dict on every transition it applies. Local, not state.
    effect_views = True

    def blocked_reason(self, job: Job, now: float) -> str | None:
        raise NotImplementedError

    def job_dict(self, job: Job, now: float, *, with_spec: bool = False) -> dict[str, Any]:
        raise NotImplementedError

    def touch(self, job_id: int) -> None:
        raise NotImplementedError

    def transition_table(self) -> dict[tuple[JobState, JobState], Handler]:
        table: dict[tuple[JobState, JobState], Handler] = {
            (P, R): self._start,
            (P, JobState.CANCELLED): self._end,
            (R, CG): self._stop,
            (R, JobState.COMPLETED): self._end,
            (R, JobState.FAILED): self._end,
            (R, JobState.NODE_FAIL): self._end,
            (R, JobState.OUT_OF_MEMORY): self._end,  # the kernel killed it for memory
            (R, P): self._requeue,  # a node failure of a --requeue job
            (CG, P): self._requeue,  # stopped to be requeued: preemption, scontrol, node
            (R, S): self._suspend,  # scontrol suspend
            (S, R): self._resume,  # scontrol resume
            (S, CG): self._stop,  # cancelled or requeued while suspended
            (S, JobState.NODE_FAIL): self._end,
            (S, P): self._requeue,  # its node failed, and it asked for --requeue
            # It ended on its own just before it was stopped (or was killed for memory).
            (S, JobState.COMPLETED): self._end,
            (S, JobState.FAILED): self._end,
            (S, JobState.OUT_OF_MEMORY): self._end,
        }
        table.update({(CG, end): self._end for end in STOPPED_INTO})
        return table

    def transition(self, job: Job, to: JobState, now: float, **details: Any) -> list[Effect]:
        handler = self._transitions.get((job.state, to))
        if handler is None:
            raise AssertionError(f"job {job.job_id}: illegal transition {job.state} -> {to}")
        return handler(job, to, now, **details)

    _transitions: dict[tuple[JobState, JobState], Handler]

    # -- the handlers ---------------------------------------------------------------------

    def _start(
        self, job: Job, to: JobState, now: float, *, allocation: dict[str, NodeAlloc]
    ) -> list[Effect]:
        job.limits = ""
        for name, alloc in allocation.items():
            self.nodes[name].take(job.job_id, alloc)
        job.allocation = dict(allocation)
        job.attempt += 1
        job.suspended_at, job.suspended_s = None, 0.0
        job.pid = None
        job.started_at = None
        job.start_time = now
        job.end_time = None
        job.reason = "None"
        self._move(job, to)
        return [self.launch_effect(job), self.emit(job, "allocated", now)]

    def _stop(
        self,
        job: Job,
        to: JobState,
        now: float,
        *,
        end_state: JobState,
        kind: str,
        grace_s: float | None = None,
    ) -> list[Effect]:
        """SIGTERM a running (or suspended) job; it ends in `end_state` (PENDING:
        requeued) once its processes are gone (the agent's report, a JobFinished). A
        suspended job is continued with the signal (the agent's part), so it can act."""
        self._end_suspension(job, now)
        self._move(job, to)
        job.end_state = end_state
        job.end_time = now
        return [
            *self.signal_effects(job, SIGTERM, escalate=True, grace_s=grace_s),
            self.emit(job, kind, now),
        ]

    def _end(
        self, job: Job, to: JobState, now: float, *, exit_code: int = 0, signal: int = 0
    ) -> list[Effect]:
        self._end_suspension(job, now)
        self._release(job, now)
        self._move(job, to)
        job.exit_code = exit_code
        job.signal = signal
        job.end_state = None
        if job.end_time is None or to is not JobState.CANCELLED:
            job.end_time = now
        if job.start_time is None:
            job.start_time = now if to is not JobState.CANCELLED else None
        end_running_steps(job, now, cancelled=to is JobState.CANCELLED)
        return [self.emit(job, "finished", now)]

    def _requeue(self, job: Job, to: JobState, now: float) -> list[Effect]:
        self._end_suspension(job, now)
        self._release(job, now)
        self._move(job, to)
        job.allocation = {}
        job.suspended_s = 0.0  # the next attempt counts its own
        job.pid = None
        job.started_at = None
        job.end_state = None
        job.start_time = None
        job.end_time = None
        job.eligible_time = now
        job.reason = self.blocked_reason(job, now) or "None"
        return [self.emit(job, "requeued", now)]

    def _suspend(self, job: Job, to: JobState, now: float) -> list[Effect]:
        """Stop every process of the job where it runs; it keeps its resources, and its
        time limit stops counting."""
        job.suspended_at = now
        self._move(job, to)
        return [*self.signal_effects(job, SIGSTOP), self.emit(job, "suspended", now)]

    def _resume(self, job: Job, to: JobState, now: float) -> list[Effect]:
        self._end_suspension(job, now)
        self._move(job, to)
        return [*self.signal_effects(job, SIGCONT), self.emit(job, "resumed", now)]

    # -- what every move does -----------------------------------------------------------

    @staticmethod
    def _end_suspension(job: Job, now: float) -> None:
        """Count the suspension that ends now (resumed, stopped, ended or requeued) into
        the time the job spent suspended. A command stamped before the suspension (two
        leaders' clocks) counts nothing rather than a negative time."""
        if job.suspended_at is not None:
            job.suspended_s += max(0.0, now - job.suspended_at)
            job.suspended_at = None

    def _move(self, job: Job, to: JobState) -> None:
        # A remainder never moves: its task leaves it first (arrays.split).
        assert not job.array_pending, f"job {job.job_id}: a remainder moved to {to}"
        self.touch(job.job_id)
        if (job.state is P) != (to is P):
            count = self.waiting.get(job.account, 0) + (1 if to is P else -1)
            if count:
                self.waiting[job.account] = count
            else:
                self.waiting.pop(job.account, None)
        if job.array_job_id is not None:
            held, holds = job.state in HOLDS_RESOURCES, to in HOLDS_RESOURCES
            if held != holds:
                count = self.array_active.get(job.array_job_id, 0) + (1 if holds else -1)
                if count:
                    self.array_active[job.array_job_id] = count
                else:
                    self.array_active.pop(job.array_job_id, None)
        job.state = to

    def _release(self, job: Job, now: float) -> None:
        self._charge(job, now)
        for name, alloc in job.allocation.items():
            node = self.nodes.get(name)
            if node is not None:
                node.give_back(job.job_id, alloc)

    def _charge(self, job: Job, now: float) -> None:
        """Add the job's GPU-seconds to its account's fair-share usage, decayed to `now`."""
        if job.start_time is None or job.state not in HOLDS_RESOURCES:
            return
        used = job.shape.resources.gpu_milli / 1000 * max(0.0, now - job.start_time)
        if not used:
            return
        # A command stamped earlier than the last one (clocks of two leaders) adds
        # without decaying backwards, so usage never grows by decay.
        as_of = max(now, self.usage_gpu_s.get(job.account, (0.0, now))[1])
        self.usage_gpu_s[job.account] = (self.usage(job.account, as_of) + used, as_of)

    def usage(self, account: str, now: float) -> float:
        """GPU-seconds the account used, decayed with the fair-share half-life."""
        value, as_of = self.usage_gpu_s.get(account, (0.0, now))
        if now <= as_of:
            return value
        return value * math.pow(0.5, (now - as_of) / self.policy.fairshare_half_life_s)

    # -- effects, each carrying the command that caused it ----------------------------------

    def emit(self, job: Job, kind: str, now: float) -> Emit:
        self.seq += 1
        job.seq = self.seq
        return Emit(
            job.job_id,
            seq=self.seq,
            kind=kind,
            at=now,
            job=self.job_dict(job, now) if self.effect_views else {},
            cmd_id=self._cmd_id,
        )

    def launch_effect(self, job: Job) -> Launch:
        first = job.nodes[0]
        return Launch(
            job.job_id,
            attempt=job.attempt,
            node=first,
            agent_url=self.nodes[first].spec.agent_url,
            job=job.to_dict(with_spec=True),
            cmd_id=self._cmd_id,
            epoch=self.nodes[first].epoch,
        )

    def signal_effects(
        self,
        job: Job,
        signal: int,
        *,
        escalate: bool = False,
        only: list[str] | None = None,
        grace_s: float | None = None,
    ) -> list[Effect]:
        targets = job.nodes if only is None else only
        return [
            Signal(
                job.job_id,
                attempt=job.attempt,
                node=name,
                agent_url=self.nodes[name].spec.agent_url,
                signal=signal,
                escalate=escalate,
                grace_s=grace_s,
                cmd_id=self._cmd_id,
            )
            for name in targets
            if name in self.nodes
        ]


__all__ = ["SIGCONT", "SIGKILL", "SIGSTOP", "SIGTERM", "STOPPED_INTO", "JobTransitions"]
