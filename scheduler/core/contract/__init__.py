"""The job contract: every fact about a job that more than one layer needs, defined once.

- `JobState` (states.py): the states, their Slurm codes, labels and kinds (active or
  over, and how it ended), in Slurm's order.
- `JobAction` (actions.py): what an owner may do to a job (cancel, hold, release,
  requeue, requeuehold).
- `JobSpec` and `SPEC_FIELDS` (spec.py): what a user asks for, each field with its type,
  default, bounds and help.
- `ResourceRequest` and `JobShape` (request.py): what a job holds per node and in all,
  and the one key that placement, the planner and the submit check group jobs by.
- `JOB_FIELDS` (job_object.py): the job object every API answers with.
- `outside_workspace` (paths.py): where a job's working directory and files may lie.

Built from it, and checked against it by tests/scheduler/core/test_contract.py and
tests/spurcloud/test_contract_layers.py: the transition table (core/jobs.py), Slurm's
state tables (scheduler/slurm/states.py), the controller's action table
(core/commands.py) and routes, the history's choices and database constraint
(spurcloud/jobs/models.py and its migrations), the API's serializers and URL patterns
(spurcloud/api), and the portal's badges (`state-<kind>`).

The package loads a part only when one of its names is first used (PEP 562): the Slurm
commands read the states and nothing else, and every command pays at start-up for what
it imports (tests/scheduler/cli/test_startup.py). `from scheduler.core.contract import
JobSpec` works as before.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (mypy reads it so)
if TYPE_CHECKING:
    from scheduler.core.contract.actions import MAX_SIGNAL, MIN_SIGNAL, JobAction
    from scheduler.core.contract.fields import Bounds, FieldDef, Kind
    from scheduler.core.contract.job_object import JOB_FIELDS, JobField, select_fields
    from scheduler.core.contract.paths import outside_workspace
    from scheduler.core.contract.request import (
        DEFAULT_SHARDS_PER_GPU,
        MILLI,
        JobShape,
        ResourceRequest,
    )
    from scheduler.core.contract.spec import GPU_FRACTION, SPEC_FIELDS, JobSpec
    from scheduler.core.contract.states import (
        ACTIVE,
        HOLDS_RESOURCES,
        TERMINAL,
        JobState,
        StateKind,
    )

# Each public name, and the part that defines it.
_PARTS = {
    "actions": ("MAX_SIGNAL", "MIN_SIGNAL", "JobAction"),
    "fields": ("Bounds", "FieldDef", "Kind"),
    "job_object": ("JOB_FIELDS", "JobField", "select_fields"),
    "paths": ("outside_workspace",),
    "request": ("DEFAULT_SHARDS_PER_GPU", "MILLI", "JobShape", "ResourceRequest"),
    "spec": ("GPU_FRACTION", "SPEC_FIELDS", "JobSpec"),
    "states": ("ACTIVE", "HOLDS_RESOURCES", "TERMINAL", "JobState", "StateKind"),
}
_WHERE = {name: part for part, names in _PARTS.items() for name in names}


def __getattr__(name: str) -> object:
    part = _WHERE.get(name)
    if part is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # `__import__`, not importlib's: the interpreter's own path, which `-X importtime`
    # (tests/scheduler/cli/test_startup.py) sees.
    value = getattr(__import__(f"{__name__}.{part}", fromlist=[name]), name)
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "ACTIVE",
    "DEFAULT_SHARDS_PER_GPU",
    "GPU_FRACTION",
    "HOLDS_RESOURCES",
    "JOB_FIELDS",
    "MAX_SIGNAL",
    "MILLI",
    "MIN_SIGNAL",
    "SPEC_FIELDS",
    "TERMINAL",
    "Bounds",
    "FieldDef",
    "JobAction",
    "JobField",
    "JobShape",
    "JobSpec",
    "JobState",
    "Kind",
    "ResourceRequest",
    "StateKind",
    "outside_workspace",
    "select_fields",
]
