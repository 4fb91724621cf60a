"""Commands: everything that happens to the cluster, as frozen data.

Each carries `cmd_id` (so one stimulus can be traced through logs, and a retried
submission is recognised) and `now`, stamped by whoever proposes it to Raft: nothing in
the core reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core.contract import JobAction, JobSpec
from scheduler.core.errors import InvalidSpec
from scheduler.core.jobs import NodeAlloc
from scheduler.core.policy import Policy
from scheduler.core.resources import NodeSpec


@dataclass(frozen=True)
class Command:
    cmd_id: str
    now: float


@dataclass(frozen=True)
class PartitionDef:
    name: str
    nodes: str = "ALL"  # "ALL" or a hostlist expression
    default: bool = False
    max_time_min: int | None = None
    default_time_min: int | None = None
    priority_tier: int = 1  # jobs of a higher tier go first, and may preempt lower tiers
    preempt_mode: str = ""  # "": the job's QoS decides; "off", "requeue" or "cancel"
    allow_accounts: tuple[str, ...] = ()  # Slurm's AllowAccounts; empty: every account


@dataclass(frozen=True)
class ConfigurePartitions(Command):
    partitions: tuple[PartitionDef, ...]


@dataclass(frozen=True)
class ConfigurePolicy(Command):
    policy: Policy


@dataclass(frozen=True)
class SubmitJob(Command):
    spec: JobSpec


@dataclass(frozen=True)
class CancelJob(Command):
    job_id: int
    by: str = ""


@dataclass(frozen=True)
class SignalJob(Command):
    job_id: int
    signal: int


@dataclass(frozen=True)
class HoldJob(Command):
    """scontrol hold (admin: JobHeldAdmin, which only an admin may release) / uhold."""

    job_id: int
    admin: bool = False


@dataclass(frozen=True)
class ReleaseJob(Command):
    job_id: int
    admin: bool = False


@dataclass(frozen=True)
class RequeueJob(Command):
    """scontrol requeue[hold]: stop a running job and put it back in the queue."""

    job_id: int
    hold: bool = False


@dataclass(frozen=True)
class SuspendJob(Command):
    """scontrol suspend: stop a running job (SIGSTOP, or its cgroup frozen), keeping its
    resources. `admin`: asked by a cluster operator, the only one who may."""

    job_id: int
    admin: bool = False


@dataclass(frozen=True)
class ResumeJob(Command):
    """scontrol resume: a suspended job runs on (SIGCONT, or its cgroup thawed)."""

    job_id: int
    admin: bool = False


@dataclass(frozen=True)
class Preempt(Command):
    """The planner's decision that `job_ids` (running) make room for `for_job` (pending):
    SIGTERM now, SIGKILL after the grace time, then requeued or ended PREEMPTED."""

    job_ids: tuple[int, ...]
    for_job: int


@dataclass(frozen=True)
class RegisterNode(Command):
    node: NodeSpec


@dataclass(frozen=True)
class Placement:
    job_id: int
    # (node name, what the job gets there), first node first.
    nodes: tuple[tuple[str, NodeAlloc], ...]


@dataclass(frozen=True)
class Allocate(Command):
    """The leader's plan for one scheduling pass, re-checked when applied."""

    placements: tuple[Placement, ...] = ()
    # New pending reasons for jobs the pass could not start: (job_id, reason).
    reasons: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class JobStarted(Command):
    job_id: int
    attempt: int
    node: str
    pid: int
    limits: str = ""  # how its memory and process limits are enforced: "cgroup2", "rlimit"


@dataclass(frozen=True)
class JobFinished(Command):
    job_id: int
    attempt: int
    node: str
    exit_code: int
    signal: int = 0
    reason: str = ""
    oom: bool = False  # the kernel killed it for exceeding its memory


@dataclass(frozen=True)
class JobVanished(Command):
    """The job's batch host stopped listing it in its heartbeats and no report of its end
    came within the grace (the agent lost it): it ends NODE_FAIL (requeued with
    --requeue), or as it was being stopped. A stale one (another attempt, an ended job)
    changes nothing."""

    job_id: int
    attempt: int
    node: str
    reason: str = "the job vanished from its node"


@dataclass(frozen=True)
class TimeLimitReached(Command):
    job_id: int
    attempt: int


@dataclass(frozen=True)
class NodeLost(Command):
    node: str
    reason: str = "Not responding"


@dataclass(frozen=True)
class DrainNode(Command):
    """scontrol update NodeName=x State=DRAIN Reason=...: the node takes no new job; what
    runs there runs on. Draining a drained node changes its reason only (idempotent)."""

    node: str
    reason: str
    by: str = ""


@dataclass(frozen=True)
class ResumeNode(Command):
    """State=RESUME: a drained node takes jobs again (a node that is not drained: no-op)."""

    node: str
    by: str = ""


# A drain's reason: what sinfo -R prints, bounded so that it cannot bloat the log.
MAX_NODE_REASON = 256


@dataclass(frozen=True)
class PurgeJobs(Command):
    """Forget jobs that ended before `ended_before` (Slurm's MinJobAge): their history
    lives on in the web app's job records."""

    ended_before: float


@dataclass(frozen=True)
class Batch(Command):
    """Commands committed as one Raft log entry (group commit: those that arrived while
    the previous entry was in flight). Every replica applies them in order, each on its
    own (`ClusterState.apply_each`): one refused changes nothing and refuses no other."""

    commands: tuple[Command, ...]


# -- the job actions of the contract, as commands ------------------------------------------


@dataclass(frozen=True)
class ActionRequest:
    """One owner's action on one job, as the controller's API receives it."""

    action: JobAction
    job_id: int
    signal: int | None = None  # cancel only: send this signal instead (scancel --signal)
    # Asked by a cluster operator: an admin hold (only an operator may release it), and
    # the operator-only actions (suspend, resume).
    admin: bool = False
    by: str = ""  # who asked (shown as who cancelled)


ACTION_COMMANDS: dict[JobAction, Callable[[str, float, ActionRequest], Command]] = {
    JobAction.CANCEL: lambda i, now, a: (
        CancelJob(i, now, a.job_id, by=a.by)
        if a.signal is None
        else SignalJob(i, now, a.job_id, a.signal)
    ),
    JobAction.HOLD: lambda i, now, a: HoldJob(i, now, a.job_id, admin=a.admin),
    JobAction.RELEASE: lambda i, now, a: ReleaseJob(i, now, a.job_id, admin=a.admin),
    JobAction.REQUEUE: lambda i, now, a: RequeueJob(i, now, a.job_id),
    JobAction.REQUEUEHOLD: lambda i, now, a: RequeueJob(i, now, a.job_id, hold=True),
    JobAction.SUSPEND: lambda i, now, a: SuspendJob(i, now, a.job_id, admin=a.admin),
    JobAction.RESUME: lambda i, now, a: ResumeJob(i, now, a.job_id, admin=a.admin),
}


def action_command(cmd_id: str, now: float, request: ActionRequest) -> Command:
    if request.signal is not None and not request.action.takes_signal:
        raise InvalidSpec(f"{request.action} takes no signal", field="signal")
    return ACTION_COMMANDS[request.action](cmd_id, now, request)


@dataclass(frozen=True)
class UpdateJob(Command):
    """scontrol update JobId=N ...: `changes` are (spec field, value) pairs of the
    contract's UPDATE_FIELDS, checked at the edge (`contract.update.parse_update`)."""

    job_id: int
    changes: tuple[tuple[str, object], ...]
    admin: bool = False  # an operator's update, which may set a negative nice


# -- job steps (srun), scheduler/core/steps.py ---------------------------------------------


@dataclass(frozen=True)
class CreateStep(Command):
    """A new step of a running job (attempt `attempt`) on `nodes`, the first of them."""

    job_id: int
    attempt: int
    name: str
    nodes: tuple[str, ...]
    ntasks: int


@dataclass(frozen=True)
class StepFinished(Command):
    job_id: int
    attempt: int
    step_id: int
    exit_code: int
    signal: int = 0


@dataclass(frozen=True)
class CancelStep(Command):
    """scancel N.S: the step's tasks are signalled on its nodes and it ends CANCELLED."""

    job_id: int
    step_id: int
    signal: int = 9
