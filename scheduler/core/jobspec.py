"""What a user asks for: the `JobSpec`, built by `sbatch` (or the API) and carried unchanged
from the CLI through the web API and the controller to the agent.

Its JSON shape (`to_dict`/`from_dict`) is the wire format of `POST /api/v1/jobs` and of the
controller's `POST /v1/jobs`. Parsing is strict: an unknown field or a wrong type is an
`InvalidSpec` with a message that names the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scheduler.core.errors import InvalidSpec

MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # Slurm's default max_script_size is 4 MB


@dataclass(frozen=True)
class JobSpec:
    script: str
    name: str = "sbatch"
    argv: tuple[str, ...] = ()  # arguments after the script name
    workdir: str = "/"  # --chdir, default the submit directory
    submit_host: str = ""
    environment: tuple[tuple[str, str], ...] = ()  # the submitter's exported environment
    stdout: str = ""  # --output pattern; "" means slurm-%j.out
    stderr: str = ""  # --error pattern; "" means the same file as stdout
    stdin: str = ""  # --input; "" means /dev/null
    partition: str = ""  # "" means the default partition
    account: str = ""  # "" means the tenant's default account
    qos: str = ""
    time_limit_min: int | None = None  # None: the partition's default
    nodes: int = 1
    ntasks: int = 1
    cpus_per_task: int = 1
    mem_per_node_mb: int | None = None  # --mem; None: the node's default share
    gpus_per_node: int = 0  # --gres=gpu[:type]:N
    gpus: int = 0  # --gpus/-G: total over the job (0: not given)
    gpu_type: str = ""  # "" means any model
    comment: str = ""
    requeue: bool = False
    # Sharing one GPU: milli-GPUs per node (API `gpu_fraction` × 1000), or Slurm shards
    # (`--gres=shard:N`), which the controller converts with its shards-per-GPU setting.
    gpu_milli: int = 0
    shards: int = 0
    constraint: str = ""  # node features: "a", "a&b", "a|b"
    nodelist: tuple[str, ...] = ()  # --nodelist, expanded
    exclude: tuple[str, ...] = ()  # --exclude, expanded
    exclusive: bool = False
    array: str = ""  # "0-15%4", "1,3,5-7", "0-15:4"
    dependency: str = ""  # "afterok:12:13,afterany:14" or "afterok:12?afternotok:13"
    hold: bool = False
    begin_time: float | None = None  # epoch seconds; the CLI parses --begin
    nice: int = 0
    # Who: stamped by the web service from the authenticated token, never from the CLI.
    tenant: str = ""
    user: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.script, str) or not self.script:
            raise InvalidSpec("the batch script is empty")
        if len(self.script.encode()) > MAX_SCRIPT_BYTES:
            raise InvalidSpec("the batch script is larger than 4 MB")
        for name in ("nodes", "ntasks", "cpus_per_task"):
            if getattr(self, name) < 1:
                raise InvalidSpec(f"{name} must be at least 1")
        for name in ("gpus_per_node", "gpus", "gpu_milli", "shards"):
            if getattr(self, name) < 0:
                raise InvalidSpec(f"{name} must not be negative")
        if self.time_limit_min is not None and self.time_limit_min < 0:
            raise InvalidSpec("time_limit_min must not be negative")
        if self.mem_per_node_mb is not None and self.mem_per_node_mb < 0:
            raise InvalidSpec("mem_per_node_mb must not be negative")
        if self.gpu_type and not (self.gpus_per_node or self.gpus or self.gpu_milli):
            raise InvalidSpec("a GPU type was given without a GPU count")
        if self.gpu_milli >= 1000 or (self.gpu_milli and (self.gpus_per_node or self.gpus)):
            raise InvalidSpec(
                "gpu_milli is a share of one GPU (1-999); ask for whole GPUs with gpus"
            )
        if self.shards and (self.gpu_milli or self.gpus_per_node or self.gpus):
            raise InvalidSpec("shards cannot be combined with whole or fractional GPUs")
        if not -10000 <= self.nice <= 10000:
            raise InvalidSpec("nice must be between -10000 and 10000")

    @property
    def gpus_on_each_node(self) -> int:
        """GPUs each allocated node must hold (--gpus=N spreads N over --nodes)."""
        if self.gpus_per_node:
            return self.gpus_per_node
        if self.gpus:
            return -(-self.gpus // self.nodes)
        return 0

    @property
    def cpus_on_each_node(self) -> int:
        tasks_per_node = -(-self.ntasks // self.nodes)
        return tasks_per_node * self.cpus_per_task

    @property
    def env(self) -> dict[str, str]:
        return dict(self.environment)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "environment":
                value = dict(value)
            elif f.name in _LIST_FIELDS:
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        if not isinstance(data, dict):
            raise InvalidSpec("a job description must be a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        data = _fraction_to_milli(data)
        unknown = set(data) - set(fields)
        if unknown:
            raise InvalidSpec(f"unknown job field(s): {', '.join(sorted(unknown))}")
        if "script" not in data:
            raise InvalidSpec("missing job field: script")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            kwargs[key] = _coerce(key, value, fields[key])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)


def _fraction_to_milli(data: dict[str, Any]) -> dict[str, Any]:
    """The API's `gpu_fraction` (a share of one GPU, 0 < f < 1) is `gpu_milli`."""
    if "gpu_fraction" not in data:
        return data
    data = dict(data)
    fraction = data.pop("gpu_fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise InvalidSpec("gpu_fraction must be a number between 0 and 1")
    if not 0 < fraction < 1:
        raise InvalidSpec("gpu_fraction must be between 0 and 1 (exclusive); ask for whole GPUs")
    if "gpu_milli" in data:
        raise InvalidSpec("give gpu_fraction or gpu_milli, not both")
    data["gpu_milli"] = max(1, round(fraction * 1000))
    return data


_INT_FIELDS = {
    "nodes",
    "ntasks",
    "cpus_per_task",
    "gpus_per_node",
    "gpus",
    "gpu_milli",
    "shards",
    "nice",
}
_OPT_INT_FIELDS = {"time_limit_min", "mem_per_node_mb"}
_LIST_FIELDS = {"argv", "nodelist", "exclude"}
_BOOL_FIELDS = {"requeue", "exclusive", "hold"}


def _coerce(key: str, value: Any, f: dataclasses.Field[Any]) -> Any:
    if key == "environment":
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise InvalidSpec("environment must be an object of strings")
        return tuple(sorted(value.items()))
    if key in _LIST_FIELDS:
        if not isinstance(value, list | tuple) or not all(isinstance(a, str) for a in value):
            raise InvalidSpec(f"{key} must be a list of strings")
        return tuple(value)
    if key == "begin_time":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidSpec("begin_time must be a number (epoch seconds) or null")
        return float(value)
    if key in _INT_FIELDS or (key in _OPT_INT_FIELDS and value is not None):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSpec(f"{key} must be an integer")
        return value
    if key in _OPT_INT_FIELDS:
        return None
    if key in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise InvalidSpec(f"{key} must be true or false")
        return value
    if not isinstance(value, str):
        raise InvalidSpec(f"{key} must be a string")
    if key == "gpu_type":
        return value.lower()
    return value


__all__ = ["JobSpec", "InvalidSpec"]
