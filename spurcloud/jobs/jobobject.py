"""The job object of the web API: the controller's job dict (docs/architecture.md, "Job
dict") with its epoch-second times as ISO 8601 UTC strings. Built either from a live
controller answer or from a `JobRecord`, with the same keys either way."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from spurcloud.jobs.models import JobRecord

TIME_KEYS = ("submit_time", "eligible_time", "start_time", "end_time")

# The keys a job dict carries that a JobRecord mirrors, with the record's field names.
RECORD_FIELDS = (
    "name",
    "user",
    "account",
    "partition",
    "qos",
    "state",
    "reason",
    "time_limit_min",
    "nodes",
    "num_nodes",
    "num_cpus",
    "num_gpus",
    "allocation",
    "exit_code",
    "signal",
    "attempt",
    "array_job_id",
    "array_task_id",
    "workdir",
    "stdout",
    "stderr",
)


def epoch_to_datetime(value: float | int | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


def iso_z(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def epoch_to_iso(value: float | int | None) -> str | None:
    return iso_z(epoch_to_datetime(value))


def from_controller(job: dict[str, Any]) -> dict[str, Any]:
    """A controller job dict as a web API job object."""
    out = dict(job)
    for key in TIME_KEYS:
        out[key] = epoch_to_iso(job.get(key))
    return out


def from_record(record: JobRecord, *, tenant: str, with_spec: bool = False) -> dict[str, Any]:
    """A JobRecord as a web API job object (the caller knows the tenant: it asked by it)."""
    out: dict[str, Any] = {"job_id": record.job_id, "tenant": tenant}
    for key in RECORD_FIELDS:
        out[key] = getattr(record, key)
    for key in TIME_KEYS:
        out[key] = iso_z(getattr(record, key))
    out["seq"] = record.last_seq
    spec = record.spec or {}
    out["gpu_type"] = spec.get("gpu_type", "")
    out["comment"] = spec.get("comment", "")
    if with_spec:
        out["spec"] = record.spec
    return out


_NULLABLE = {"time_limit_min", "exit_code", "signal", "array_job_id", "array_task_id"}


def _max_lengths() -> dict[str, int]:
    return {
        f.name: f.max_length
        for f in JobRecord._meta.concrete_fields
        if getattr(f, "max_length", None) and f.name in RECORD_FIELDS
    }


def record_fields(job: dict[str, Any]) -> dict[str, Any]:
    """The JobRecord fields a controller job dict sets (absent keys are left alone). Text
    longer than its column is cut: a long pending reason must not lose the whole event."""
    limits = _max_lengths()
    fields: dict[str, Any] = {}
    for key in RECORD_FIELDS:
        if key in job:
            value = job[key]
            if value is None and key not in _NULLABLE:
                continue  # a text or count field the controller did not fill in
            if key in limits and isinstance(value, str):
                value = value[: limits[key]]
            fields[key] = value
    for key in TIME_KEYS:
        if key in job:
            fields[key] = epoch_to_datetime(job[key])
    if "spec" in job and job["spec"] is not None:
        fields["spec"] = job["spec"]
    return fields
