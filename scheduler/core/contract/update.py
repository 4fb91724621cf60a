"""What an owner may change on a pending job (`scontrol update JobId=N ...`): a few of the
spec's own fields, with the spec's own kinds and bounds (`SPEC_FIELDS`). The controller's
`UpdateJob`, its API and the web API's request body are built from `UPDATE_FIELDS`.
"""

from __future__ import annotations

from typing import Any

from scheduler.core.contract.fields import FieldDef
from scheduler.core.contract.spec import BY_NAME
from scheduler.core.errors import InvalidSpec

# Slurm's keys (scontrol update) for each: JobName, TimeLimit, Nice, Partition, Comment.
UPDATE_FIELDS: tuple[FieldDef, ...] = tuple(
    BY_NAME[name] for name in ("name", "time_limit_min", "nice", "partition", "comment")
)
_UPDATABLE = {f.name: f for f in UPDATE_FIELDS}


def parse_update(data: Any) -> tuple[tuple[str, Any], ...]:
    """The changes of an update body, checked as the spec checks them, sorted by field.
    InvalidSpec names the field at fault (or one that may not be changed)."""
    if not isinstance(data, dict) or not data:
        raise InvalidSpec(
            f"an update changes at least one of: {', '.join(_UPDATABLE)}", field="non_field_errors"
        )
    changes = []
    for key, raw in sorted(data.items()):
        f = _UPDATABLE.get(str(key))
        if f is None:
            raise InvalidSpec(
                f"{key} cannot be changed; these can: {', '.join(_UPDATABLE)}", field=str(key)
            )
        value = f.from_wire(raw)
        f.check(value)
        changes.append((f.name, value))
    return tuple(changes)


__all__ = ["UPDATE_FIELDS", "parse_update"]
