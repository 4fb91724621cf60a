"""Jobs as the controller tracks them. Their states come from the contract
(`scheduler/core/contract`); the transitions between them are `transitions.py`'s table."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from scheduler.core.contract import DEFAULT_SHARDS_PER_GPU, JobShape, JobSpec, JobState
from scheduler.core.contract.steps import Step

if TYPE_CHECKING:
    from scheduler.core.dependencies import Dependency


# Slurm's default --output: per job, or per array task.
DEFAULT_OUTPUT = {False: "slurm-%j.out", True: "slurm-%A_%a.out"}


@dataclass(frozen=True)
class NodeAlloc:
    """What one job holds on one node."""

    gpus: tuple[int, ...]
    cpus: int
    mem_mb: int
    # Milli-GPUs taken on each of `gpus` (same order); empty means all 1000 of each.
    gpu_milli: tuple[int, ...] = ()
    # The CPUs the job is bound to (from the NUMA nodes of its GPUs); empty: not bound.
    cpu_ids: tuple[int, ...] = ()

    def milli(self, i: int) -> int:
        return self.gpu_milli[i] if self.gpu_milli else 1000

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpus": list(self.gpus), "cpus": self.cpus, "mem_mb": self.mem_mb}
        if self.gpu_milli:
            out["gpu_milli"] = list(self.gpu_milli)
        if self.cpu_ids:
            out["cpu_ids"] = list(self.cpu_ids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeAlloc:
        return cls(
            gpus=tuple(int(g) for g in data["gpus"]),
            cpus=int(data["cpus"]),
            mem_mb=int(data["mem_mb"]),
            gpu_milli=tuple(int(m) for m in data.get("gpu_milli", ())),
            cpu_ids=tuple(int(c) for c in data.get("cpu_ids", ())),
        )


@dataclass
class Job:
    job_id: int
    spec: JobSpec
    partition: str
    account: str
    time_limit_min: int | None
    submit_time: float
    state: JobState = JobState.PENDING
    reason: str = "None"
    eligible_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    # scontrol suspend: since when it is suspended (None: it is not), and the seconds
    # this attempt spent suspended before; its time limit counts only the rest.
    suspended_at: float | None = None
    suspended_s: float = 0.0
    # Allocation, in the order the nodes were chosen: the batch script runs on the first.
    allocation: dict[str, NodeAlloc] = field(default_factory=dict)
    attempt: int = 0
    pid: int | None = None  # set when the agent reports the batch script started
    limits: str = ""  # how the agent enforced its memory and process limits
    started_at: float | None = None  # when that report was committed
    exit_code: int | None = None
    signal: int | None = None
    # While COMPLETING: the state the job ends in once its processes are gone.
    end_state: JobState | None = None
    cancelled_by: str = ""
    seq: int = 0
    qos: str = "normal"
    # Arrays: the task at position p of the array's task ids has job id `array_job_id + p`
    # (reserved at submit); the first task's job id is the array job id.
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_throttle: int = 0  # `%N`: at most N tasks of the array hold resources at once
    # The array's pending remainder (Slurm's meta job): the job ids of the other pending
    # tasks this record stands for, ascending, all above its own. It is the lowest of them
    # itself; a task leaves it (`arrays.split`) when it starts or a command names it.
    array_pending: tuple[int, ...] = ()
    depends: Dependency | None = None  # parsed `spec.dependency`
    hold: str = ""  # "", "user" (JobHeldUser) or "admin" (JobHeldAdmin)
    priority: int = 0  # filled by the ordering piece
    # Its job steps (srun), oldest first; a tuple, replaced on each change (a snapshot of
    # an older state unpickles without it and reads the class default).
    steps: tuple[Step, ...] = ()
    # What it asks for and where, fixed when the controller accepts it (shards are
    # converted with the shards per GPU of that moment).
    shape: JobShape = field(init=False)
    shards_per_gpu: InitVar[int] = DEFAULT_SHARDS_PER_GPU

    def __post_init__(self, shards_per_gpu: int) -> None:
        self.shape = JobShape.of(self.spec, self.partition, shards_per_gpu=shards_per_gpu)

    @property
    def display_id(self) -> str:
        """`123_4` for an array task, `123_[4-9]` for a pending remainder, as squeue and
        sacct print them."""
        if self.array_job_id is None:
            return str(self.job_id)
        if self.array_pending:
            return f"{self.array_job_id}_[{array_tasks(self)}]"
        return f"{self.array_job_id}_{self.array_task_id}"

    @property
    def task_count(self) -> int:
        """How many tasks (or jobs) this record stands for."""
        return 1 + len(self.array_pending)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.allocation)

    @property
    def num_cpus(self) -> int:
        """CPUs held, or asked for (an exclusive job holds its nodes' CPUs)."""
        if self.allocation:
            return sum(a.cpus for a in self.allocation.values())
        return self.shape.resources.cpus

    def run_deadline(self) -> float | None:
        """When its time limit runs out, counting only the time it ran (not the time
        it spent suspended); None without a limit, before it starts, or while it is
        suspended (it does not run out then)."""
        if not self.time_limit_min or self.start_time is None or self.suspended_at is not None:
            return None
        return self.start_time + self.suspended_s + self.time_limit_min * 60.0

    def to_dict(
        self,
        *,
        with_spec: bool = False,
        dependency: str | None = None,
        fields: Iterable[str] | None = None,
    ) -> dict[str, Any]:
        """The job object (the contract's `JOB_FIELDS`), or only `fields` of it (the
        contract's names: `contract.select_fields`), with its spec if asked either way.
        `dependency`: squeue's %E as the state describes it now; the raw `--dependency`
        when not given (what a snapshot keeps)."""
        if fields is None:
            getters: Iterable[tuple[str, Callable[[Job], Any]]] = VIEW.items()
        else:
            getters = [(k, VIEW[k]) for k in fields if k in VIEW]
            with_spec = with_spec or "spec" in fields
        out = {key: get(self) for key, get in getters}
        if dependency is not None and "dependency" in out:
            out["dependency"] = dependency
        if with_spec:
            out["spec"] = self.spec.to_dict()
        return out


def array_tasks(job: Job) -> str:
    """The task ids a pending remainder stands for, as Slurm writes them (`4-9,12`)."""
    # Imported here: arrays.py reads jobs, jobs do not need arrays but for this.
    from scheduler.core.arrays import compress, task_ids

    assert job.array_job_id is not None and job.spec.array
    ids = task_ids(job.spec.array)
    first = job.array_job_id
    return compress(ids[j - first] for j in (job.job_id, *job.array_pending))


# The job object's fields as a job gives them, in the contract's order: one getter each,
# so that a list cut to a few fields (squeue's) computes only those.
VIEW: dict[str, Callable[[Job], Any]] = {
    "job_id": attrgetter("job_id"),
    "name": attrgetter("spec.name"),
    "tenant": attrgetter("spec.tenant"),
    "user": attrgetter("spec.user"),
    "account": attrgetter("account"),
    "partition": attrgetter("partition"),
    "qos": attrgetter("qos"),
    "priority": attrgetter("priority"),
    "array_job_id": attrgetter("array_job_id"),
    # A pending remainder is no one task: its tasks are `array_tasks`.
    "array_task_id": lambda job: None if job.array_pending else job.array_task_id,
    "array_tasks": lambda job: array_tasks(job) if job.array_pending else "",
    "array_throttle": attrgetter("array_throttle"),
    "dependency": attrgetter("spec.dependency"),
    "held": lambda job: bool(job.hold),
    "state": attrgetter("state.value"),
    "reason": attrgetter("reason"),
    "submit_time": attrgetter("submit_time"),
    "eligible_time": attrgetter("eligible_time"),
    "start_time": attrgetter("start_time"),
    "end_time": attrgetter("end_time"),
    "suspended_at": attrgetter("suspended_at"),
    "suspended_s": attrgetter("suspended_s"),
    "time_limit_min": attrgetter("time_limit_min"),
    "nodes": lambda job: list(job.allocation),
    "num_nodes": lambda job: len(job.allocation) or job.spec.nodes,
    "num_cpus": attrgetter("num_cpus"),
    "num_gpus": attrgetter("shape.resources.gpus"),
    "gpu_milli": attrgetter("shape.resources.gpu_milli"),
    "gpu_type": attrgetter("spec.gpu_type"),
    "allocation": lambda job: {n: a.to_dict() for n, a in job.allocation.items()},
    "exit_code": attrgetter("exit_code"),
    "signal": attrgetter("signal"),
    "attempt": attrgetter("attempt"),
    "pid": attrgetter("pid"),
    "limits": attrgetter("limits"),
    "started_at": attrgetter("started_at"),
    "workdir": lambda job: job.spec.workdir or job.spec.submit_dir,
    "stdout": lambda job: job.spec.stdout or DEFAULT_OUTPUT[job.array_job_id is not None],
    "stderr": attrgetter("spec.stderr"),
    "comment": attrgetter("spec.comment"),
    "cancelled_by": attrgetter("cancelled_by"),
    # When and where a pending job is expected to start is the leader's estimate, not the
    # job's: the controller fills them in (scheduler/ctld/reads.py). A job waiting for
    # its begin time knows when at the earliest, and Slurm shows that.
    "expected_start": lambda job: (
        job.spec.begin_time if job.state is JobState.PENDING and job.reason == "BeginTime" else None
    ),
    "sched_nodes": lambda job: [],
    "interactive": attrgetter("spec.interactive"),
    "steps": lambda job: [s.to_dict() for s in job.steps],
    "seq": attrgetter("seq"),
}


__all__ = ["DEFAULT_OUTPUT", "VIEW", "Job", "NodeAlloc", "array_tasks"]
