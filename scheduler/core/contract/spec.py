"""What a user asks for: the `JobSpec`, built by `sbatch` (or the API) and carried unchanged
from the CLI through the web API and the controller to the agent.

Each field is declared once, here, with its type, default, bounds and help
(`spec_field`); `SPEC_FIELDS` lists them for the layers that build their own shapes from
them (the API's request serializer, and so the OpenAPI schema). Its JSON shape
(`to_dict`/`from_dict`) is the wire format of `POST /api/v1/jobs` and of the
controller's `POST /v1/jobs`. Parsing is strict: an unknown field, a wrong type or a
value out of bounds is an `InvalidSpec` that names the field. A `JobSpec` that exists is
valid: the checks run on construction, so nothing unbounded reaches the Raft log.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scheduler.core.arrays import parse_array
from scheduler.core.contract import ssh
from scheduler.core.contract.fields import Bounds, FieldDef, Kind, fields_of, spec_field
from scheduler.core.dependencies import parse_dependency
from scheduler.core.errors import InvalidSpec, Rejected

MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # Slurm's default max_script_size is 4 MB
MAX_TIME_LIMIT_MIN = 366 * 24 * 60  # a year; 0 asks for no limit (the partition's cap)
MAX_NODES = 65_536
PATH_MAX = 4096
NAME_MAX = 64  # partition, account, QoS and GPU model names
ARG_MAX = 131_072  # Linux's MAX_ARG_STRLEN: one argument or environment string
LAST_EPOCH_S = 4_102_444_800.0  # 2100-01-01: a begin time beyond it is a typo


@dataclass(frozen=True)
class JobSpec:
    script: str = spec_field(
        dataclasses.MISSING,
        "The batch script, with its #! line (at most 4 MB).",
        max_length=MAX_SCRIPT_BYTES,
    )
    name: str = spec_field("sbatch", "The job's name (squeue %j).", max_length=200)
    argv: tuple[str, ...] = spec_field(
        (),
        "Arguments after the script name.",
        max_length=4096,
        item_max_length=ARG_MAX,
    )
    workdir: str = spec_field(
        "",
        "Where the job runs (--chdir): inside the organisation's workspace, relative to "
        'it or absolute; "": the submit directory when that lies in the workspace, else a '
        "directory of the job's own there.",
        max_length=PATH_MAX,
    )
    submit_dir: str = spec_field(
        "", "The directory sbatch ran in (SLURM_SUBMIT_DIR).", max_length=PATH_MAX
    )
    submit_host: str = spec_field("", "The host the job was submitted from.", max_length=255)
    environment: tuple[tuple[str, str], ...] = spec_field(
        (),
        "The submitter's exported environment (--export).",
        max_length=4096,
        item_max_length=ARG_MAX,
    )
    stdout: str = spec_field(
        "", 'The --output pattern; "" means slurm-%j.out.', max_length=PATH_MAX
    )
    stderr: str = spec_field(
        "", 'The --error pattern; "" means the same file as stdout.', max_length=PATH_MAX
    )
    stdin: str = spec_field("", 'The --input file; "" means /dev/null.', max_length=PATH_MAX)
    partition: str = spec_field("", '"" means the default partition.', max_length=NAME_MAX)
    account: str = spec_field("", '"" means the organisation\'s account.', max_length=NAME_MAX)
    qos: str = spec_field("", '"" means the default QoS ("normal").', max_length=NAME_MAX)
    time_limit_min: int | None = spec_field(
        None,
        "Minutes the job may run; null: the partition's default; 0: no limit of its own.",
        minimum=0,
        maximum=MAX_TIME_LIMIT_MIN,
    )
    nodes: int = spec_field(1, "Nodes (-N).", minimum=1, maximum=MAX_NODES)
    ntasks: int = spec_field(1, "Tasks (-n).", minimum=1, maximum=1 << 20)
    cpus_per_task: int = spec_field(1, "CPUs per task (-c).", minimum=1, maximum=4096)
    mem_per_node_mb: int | None = spec_field(
        None,
        "Memory per node in MB (--mem); null: the node's memory per CPU; 0: all of it.",
        minimum=0,
        maximum=1 << 26,
    )
    gpus_per_node: int = spec_field(
        0, "Whole GPUs on each node (--gres=gpu:N).", minimum=0, maximum=256
    )
    gpus: int = spec_field(
        0,
        "Whole GPUs over the job (--gpus); spread evenly, rounding up, over its nodes.",
        minimum=0,
        maximum=1 << 20,
    )
    gpu_type: str = spec_field(
        "", 'A GPU model ("mi300x", "h100"); "" means any.', max_length=NAME_MAX
    )
    comment: str = spec_field("", "A comment (squeue %k).", max_length=1024)
    requeue: bool | None = spec_field(
        None,
        "true (--requeue): requeued after a node failure; false (--no-requeue): never "
        "requeued, not even when preempted; null: requeued only when preempted.",
    )
    # Sharing one GPU: milli-GPUs per node (API `gpu_fraction` × 1000), or Slurm shards
    # (`--gres=shard:N`), which the controller converts with its shards-per-GPU setting.
    gpu_milli: int = spec_field(
        0, "A share of one GPU on each node, in thousandths (1-999).", minimum=0, maximum=999
    )
    shards: int = spec_field(
        0, "Slurm shards of a GPU (--gres=shard:N).", minimum=0, maximum=1 << 16
    )
    constraint: str = spec_field("", 'Node features: "a", "a&b", "a|b" (-C).', max_length=1024)
    nodelist: tuple[str, ...] = spec_field(
        (), "Nodes the job must use (-w), expanded.", max_length=MAX_NODES, item_max_length=255
    )
    exclude: tuple[str, ...] = spec_field(
        (), "Nodes the job must not use (-x), expanded.", max_length=MAX_NODES, item_max_length=255
    )
    exclusive: bool = spec_field(False, "Whole nodes, shared with no other job.")
    array: str = spec_field(
        "", 'A job array: "0-15%4", "1,3,5-7", "0-15:4" (task ids up to 1000).', max_length=1024
    )
    dependency: str = spec_field(
        "", '"afterok:12:13,afterany:14" or "afterok:12?afternotok:13".', max_length=4096
    )
    hold: bool = spec_field(False, "Submit held (-H): it waits until released.")
    begin_time: float | None = spec_field(
        None,
        "Epoch seconds before which the job may not start (--begin).",
        minimum=0,
        maximum=LAST_EPOCH_S,
    )
    nice: int = spec_field(
        0, "Lowers the job's priority by this much.", minimum=-10000, maximum=10000
    )
    interactive: bool = spec_field(
        False, "An allocation for salloc or srun: its script only holds it (no batch step)."
    )
    # Who: stamped by the web service from the authenticated token, never from the CLI.
    tenant: str = spec_field("", "The organisation.", max_length=NAME_MAX, stamped=True)
    user: str = spec_field("", "The submitter's user name.", max_length=150, stamped=True)
    ssh_keys: tuple[str, ...] = spec_field(
        (),
        "OpenSSH public keys ('<type> <base64>') that may open an SSH shell in the running "
        "job (contract/ssh.py): the submitter's account keys, stamped by the platform at "
        "launch and fixed from then on.",
        max_length=ssh.MAX_KEYS,
        item_max_length=ssh.MAX_KEY_LINE,
        stamped=True,
    )

    def __post_init__(self) -> None:
        for f in SPEC_FIELDS:
            value = getattr(self, f.name)
            # A field at its default is within bounds (checked once, below SPEC_FIELDS).
            if value is not f.default:
                f.check(value)
        if not self.script:
            raise InvalidSpec("the batch script is empty", field="script")
        if len(self.script.encode()) > MAX_SCRIPT_BYTES:
            raise InvalidSpec("the batch script is larger than 4 MB", field="script")
        if self.gpu_type and not (self.gpus_per_node or self.gpus or self.gpu_milli):
            raise InvalidSpec("a GPU type was given without a GPU count", field="gpu_type")
        if self.gpu_milli and (self.gpus_per_node or self.gpus):
            raise InvalidSpec(
                "gpu_milli is a share of one GPU (1-999); ask for whole GPUs with gpus",
                field="gpu_milli",
            )
        if self.shards and (self.gpu_milli or self.gpus_per_node or self.gpus):
            raise InvalidSpec(
                "shards cannot be combined with whole or fractional GPUs", field="shards"
            )
        ssh.check_keys(self.ssh_keys)
        # The syntax of arrays and dependencies is checked here, at the edge: an array
        # of a hundred million tasks must never reach the log.
        for field, parse in (("array", parse_array), ("dependency", parse_dependency)):
            if getattr(self, field):
                try:
                    parse(getattr(self, field))
                except Rejected as exc:
                    raise InvalidSpec(exc.message, field=field) from None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.environment)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: f.to_wire(getattr(self, f.name)) for f in SPEC_FIELDS}

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        if not isinstance(data, dict):
            raise InvalidSpec("a job description must be a JSON object")
        data = _fraction_to_milli(data)
        unknown = set(data) - set(BY_NAME)
        if unknown:
            raise InvalidSpec(f"unknown job field(s): {', '.join(sorted(unknown))}")
        if "script" not in data:
            raise InvalidSpec("missing job field: script", field="script")
        kwargs = {key: BY_NAME[key].from_wire(value) for key, value in data.items()}
        if isinstance(kwargs.get("gpu_type"), str):
            kwargs["gpu_type"] = kwargs["gpu_type"].lower()
        return cls(**kwargs)

    def replace(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)


SPEC_FIELDS: tuple[FieldDef, ...] = fields_of(JobSpec)
BY_NAME = {f.name: f for f in SPEC_FIELDS}
for _f in SPEC_FIELDS:  # what lets a spec skip checking a field at its default
    if _f.default is not dataclasses.MISSING:
        _f.check(_f.default)

# The API's `gpu_fraction`: a share of one GPU as a fraction, converted to `gpu_milli`.
GPU_FRACTION = FieldDef(
    "gpu_fraction",
    Kind.NUMBER,
    nullable=False,
    default=dataclasses.MISSING,
    bounds=Bounds(
        "A share of one GPU on each node (0.001-0.999); the same as gpu_milli / 1000.",
        minimum=0.001,
        maximum=0.999,
    ),
)


def _fraction_to_milli(data: dict[str, Any]) -> dict[str, Any]:
    if GPU_FRACTION.name not in data:
        return data
    data = dict(data)
    fraction = GPU_FRACTION.from_wire(data.pop(GPU_FRACTION.name))
    GPU_FRACTION.check(fraction)
    if "gpu_milli" in data:
        raise InvalidSpec("give gpu_fraction or gpu_milli, not both", field="gpu_fraction")
    data["gpu_milli"] = max(1, min(999, round(fraction * 1000)))
    return data


__all__ = ["GPU_FRACTION", "SPEC_FIELDS", "InvalidSpec", "JobSpec"]
