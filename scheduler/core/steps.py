"""Job steps in the state machine: created, finished and cancelled by command.

The contract of a step is scheduler/core/contract/steps.py; the controller's edge
(scheduler/ctld/steps.py) bounds each request before it is proposed, and these
handlers check it again against the state, the same way on every replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.core import commands as c
from scheduler.core.contract import JobState
from scheduler.core.contract.steps import (
    MAX_STEP_NAME,
    MAX_STEP_TASKS,
    MAX_STEPS_PER_JOB,
    Step,
    StepState,
    step_state_of,
)
from scheduler.core.effects import Effect, Signal
from scheduler.core.errors import Rejected

if TYPE_CHECKING:
    from scheduler.core.jobs import Job
    from scheduler.core.state import ClusterState


def _running(state: ClusterState, job_id: int, attempt: int | None) -> Job:
    job = state.job(job_id)
    if job.state is not JobState.RUNNING or (attempt is not None and job.attempt != attempt):
        raise Rejected(f"job {job_id} is not running", code="not_running")
    return job


def create(state: ClusterState, cmd: c.CreateStep) -> list[Effect]:
    job = _running(state, cmd.job_id, cmd.attempt)
    if any(s.cmd_id == cmd.cmd_id for s in job.steps):
        return []  # the same proposal applied twice
    if len(job.steps) >= MAX_STEPS_PER_JOB:
        raise Rejected(f"job {cmd.job_id} has {MAX_STEPS_PER_JOB} steps already")
    if not cmd.nodes or len(set(cmd.nodes)) != len(cmd.nodes):
        raise Rejected("a step needs distinct nodes")
    if not set(cmd.nodes) <= set(job.allocation):
        raise Rejected("a step runs on its job's nodes only")
    if not 1 <= cmd.ntasks <= MAX_STEP_TASKS or cmd.ntasks < len(cmd.nodes):
        raise Rejected("a step runs at least one task per node")
    if len(cmd.name) > MAX_STEP_NAME:
        raise Rejected("step name too long")
    cpus = sum(job.allocation[n].cpus for n in cmd.nodes)
    step = Step(len(job.steps), cmd.name, cmd.nodes, cmd.ntasks, cpus, cmd.now, cmd_id=cmd.cmd_id)
    job.steps = (*job.steps, step)
    return [state.emit(job, "step_started", cmd.now)]


def _step(job: Job, step_id: int) -> Step:
    if not 0 <= step_id < len(job.steps):
        raise Rejected(f"Invalid job id specified: {job.job_id}.{step_id}", code="not_found")
    return job.steps[step_id]


def _replace(job: Job, step: Step) -> None:
    job.steps = tuple(step if s.step_id == step.step_id else s for s in job.steps)


def finish(state: ClusterState, cmd: c.StepFinished) -> list[Effect]:
    job = state.job(cmd.job_id)
    if job.attempt != cmd.attempt:
        return []  # a stale report
    step = _step(job, cmd.step_id)
    if step.state.is_terminal:
        return []  # already ended (cancelled, or a duplicate report)
    new_state = step_state_of(cmd.exit_code, cmd.signal)
    _replace(job, step.ended(new_state, cmd.now, cmd.exit_code, cmd.signal))
    return [state.emit(job, "step_finished", cmd.now)]


def cancel(state: ClusterState, cmd: c.CancelStep) -> list[Effect]:
    job = _running(state, cmd.job_id, None)
    step = _step(job, cmd.step_id)
    if step.state.is_terminal:
        return []
    _replace(job, step.ended(StepState.CANCELLED, cmd.now, 0, cmd.signal))
    effects: list[Effect] = [
        Signal(
            job.job_id,
            attempt=job.attempt,
            node=node,
            agent_url=state.nodes[node].spec.agent_url if node in state.nodes else "",
            signal=cmd.signal,
            step_id=step.step_id,
            cmd_id=cmd.cmd_id,
        )
        for node in step.nodes
    ]
    effects.append(state.emit(job, "step_cancelled", cmd.now))
    return effects


def end_running_steps(job: Job, now: float, *, cancelled: bool) -> None:
    """A job that ends takes its running steps with it."""
    if any(not s.state.is_terminal for s in job.steps):
        job.steps = tuple(
            s
            if s.state.is_terminal
            else s.ended(StepState.CANCELLED if cancelled else StepState.FAILED, now, 0, 9)
            for s in job.steps
        )
