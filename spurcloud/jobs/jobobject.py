"""The job object of the web API: the controller's job dict (the contract's
`JOB_FIELDS`) with its epoch-second times as ISO 8601 UTC strings.

Built either from a live controller answer (every field) or from a `JobRecord` (the
fields the history keeps, `HISTORY_FIELDS`), with the same keys and meaning either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.db.models import BigIntegerField, Func, JSONField, QuerySet, TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from orjson import Fragment

from scheduler.core.contract import JOB_FIELDS, Kind
from scheduler.core.contract.runs import RUNS, encode_column
from spurcloud.jobs.models import JobRecord

TIME_KEYS = tuple(f.name for f in JOB_FIELDS if f.kind is Kind.TIME and f.history)
HISTORY_FIELDS = tuple(f.name for f in JOB_FIELDS if f.history and f.always)
# What the record does not keep as a column of the same name: the id and organisation
# are its key, the times are datetimes, the sequence is `last_seq`, and the GPU model
# and the comment are read from the spec it keeps.
_FROM_SPEC = ("gpu_type", "comment")
RECORD_FIELDS = tuple(
    name
    for name in HISTORY_FIELDS
    if name not in ("job_id", "tenant", "seq", *TIME_KEYS, *_FROM_SPEC)
)
_NULLABLE = frozenset(f.name for f in JOB_FIELDS if f.nullable)


def epoch_to_datetime(value: float | int | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


def iso_z(value: datetime | None) -> str | None:
    """`value` to the second, as ISO 8601 UTC (`2026-12-01T09:00:05Z`)."""
    if value is None:
        return None
    return _iso_second(math.floor(value.timestamp()))


def epoch_to_iso(value: float | int | None) -> str | None:
    if value is None:
        return None
    return _iso_second(math.floor(float(value)))


@lru_cache(maxsize=65_536)
def _iso_second(second: int) -> str:
    # Cached: a list of 10,000 jobs holds a few hundred distinct seconds, and formatting
    # one is the most of what converting a job object costs.
    return datetime.fromtimestamp(second, tz=UTC).replace(tzinfo=None).isoformat() + "Z"


def from_controller(job: dict[str, Any], fields: Sequence[str] | None = None) -> dict[str, Any]:
    """A controller job dict as a web API job object, cut to `fields` where given."""
    out = dict(job) if fields is None else {k: job[k] for k in fields if k in job}
    for name in _ALL_TIME_KEYS:
        if name in out:
            out[name] = epoch_to_iso(out[name])
    return out


def from_record(record: JobRecord, *, tenant: str, with_spec: bool = False) -> dict[str, Any]:
    """A JobRecord as a web API job object (the caller knows the tenant: it asked by it)."""
    spec = record.spec or {}
    out: dict[str, Any] = {}
    for name in HISTORY_FIELDS:
        if name == "tenant":
            out[name] = tenant
        elif name == "seq":
            out[name] = record.last_seq
        elif name in TIME_KEYS:
            out[name] = iso_z(getattr(record, name))
        elif name in _FROM_SPEC:
            value = spec.get(name, "")
            out[name] = "" if value is None else value
        else:
            out[name] = getattr(record, name)
    if with_spec:
        out["spec"] = record.spec
    return out


def _selected(fields: Sequence[str], epochs: bool) -> tuple[list[str], dict[str, Any]]:
    """The record's columns that `fields` need, and the expressions computed in the
    database (`history_values`)."""
    skip = ("tenant", *_FROM_SPEC, *((*TIME_KEYS, *_JSON_COLUMNS) if epochs else ()))
    columns = [_COLUMN.get(name, name) for name in fields if name not in skip]
    extra: dict[str, Any] = {
        f"spec_{name}": KT(f"spec__{name}") for name in _FROM_SPEC if name in fields
    }
    if epochs:
        extra.update({f"epoch_{name}": EpochSecond(name) for name in TIME_KEYS if name in fields})
        # A JSON column (nodes, allocation, steps) as the text the database keeps: it is
        # passed on into the answer as it is (`orjson.Fragment`), never decoded here.
        extra.update(
            {f"json_{name}": Cast(name, TextField()) for name in _JSON_COLUMNS if name in fields}
        )
    return columns, extra


def history_values(
    records: QuerySet[JobRecord], fields: Sequence[str] = HISTORY_FIELDS, *, epochs: bool = False
) -> QuerySet[JobRecord, dict[str, Any]]:
    """`records` as rows of the columns that `fields` (of HISTORY_FIELDS) need, for
    `from_values`: no model instances (building 10,000 costs more than the query), nor
    every job's spec and script, only the spec keys shown, read in the database. With
    `epochs`, the times come as whole epoch seconds, computed by the database: no
    datetime is made of them at all."""
    columns, extra = _selected(fields, epochs)
    rows: QuerySet[JobRecord, dict[str, Any]] = records.values("job_id", *columns, **extra)
    return rows


def history_tuples(
    records: QuerySet[JobRecord], fields: Sequence[str]
) -> tuple[QuerySet[JobRecord, tuple[Any, ...]], list[str]]:
    """`records` as tuples of what `fields` need for `columns_of_tuples` (times in epoch
    seconds, as `history_values` with `epochs`), the job id first (the pages' cursor
    reads it there), and the name of each place: no dict a row (a page of 10,000 jobs
    would build 10,000)."""
    columns, extra = _selected(fields, epochs=True)
    names = ["job_id", *(c for c in columns if c != "job_id"), *extra]
    rows: QuerySet[JobRecord, tuple[Any, ...]] = records.annotate(**extra).values_list(*names)
    return rows, names


def columns_of_tuples(
    rows: Sequence[tuple[Any, ...]],
    names: Sequence[str],
    *,
    tenant: str,
    fields: Sequence[str],
    runs: bool = False,
) -> dict[str, Any]:
    """`history_tuples` rows (their columns named by `names`, in order) as the columns
    of a columns answer (`contract.job_object.to_columns`'s shape): each field a list,
    times in epoch seconds; with `runs`, each in runs where that is shorter
    (`contract.runs`, `shape=runs`). A JSON column's values are the database's text,
    passed on as it is (`orjson.Fragment`): its runs are counted on the text, so that
    10,000 jobs on one node, or with no steps, send one value, not 10,000."""
    count = len(rows)
    by_name = dict(zip(names, zip(*rows, strict=True), strict=True)) if count else {}
    columns: dict[str, Any] = {}
    for name in fields:
        if name == "tenant":
            column: Any = [tenant] * count
        elif name in _FROM_SPEC:
            column = ["" if v is None else v for v in by_name.get(f"spec_{name}", ())]
        elif name in _JSON_COLUMNS:
            column = list(by_name.get(f"json_{name}", ()))
        else:
            key = f"epoch_{name}" if name in TIME_KEYS else _COLUMN.get(name, name)
            column = list(by_name.get(key, ()))
        if runs:
            column = encode_column(column)
        columns[name] = _as_json(column) if name in _JSON_COLUMNS else column
    return columns


def _as_json(column: list[Any] | dict[str, list[list[Any]]]) -> Any:
    """A column of JSON texts (or their runs) as the values to send: each text as it is."""
    if isinstance(column, dict):
        return {RUNS: [[None if v is None else Fragment(v), n] for v, n in column[RUNS]]}
    return [None if v is None else Fragment(v) for v in column]


class EpochSecond(Func):
    """A datetime column as whole seconds since the epoch, computed in the database."""

    output_field = BigIntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Django keeps SQLite's datetimes as UTC text; strftime('%s') reads it so.
        return self.as_sql(
            compiler, connection, template="CAST(strftime('%%%%s', %(expressions)s) AS INTEGER)"
        )

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            template="CAST(FLOOR(EXTRACT(EPOCH FROM %(expressions)s)) AS BIGINT)",
        )


def from_values(row: dict[str, Any], *, tenant: str, fields: Sequence[str]) -> dict[str, Any]:
    """A `history_values` row as a web API job object of `fields`."""
    out: dict[str, Any] = {}
    for name in fields:
        if name == "tenant":
            out[name] = tenant
        elif name in _FROM_SPEC:
            value = row.get(f"spec_{name}")
            out[name] = "" if value is None else value
        elif name in TIME_KEYS:
            out[name] = iso_z(row[name])
        else:
            out[name] = row[_COLUMN.get(name, name)]
    return out


_COLUMN = {"seq": "last_seq"}  # the record's column for a job object field of another name
_JSON_COLUMNS = tuple(
    f.name for f in JobRecord._meta.concrete_fields if isinstance(f, JSONField) and f.name != "spec"
)
_ALL_TIME_KEYS = tuple(f.name for f in JOB_FIELDS if f.kind is Kind.TIME)


# The record's text columns' lengths, by field: read once (every event and submission
# cuts its text to them, and reading the model's fields each time was half of that).
_MAX_LENGTHS = {
    f.name: max_length
    for f in JobRecord._meta.concrete_fields
    if (max_length := getattr(f, "max_length", None)) and f.name in RECORD_FIELDS
}


def record_fields(job: dict[str, Any]) -> dict[str, Any]:
    """The JobRecord fields a controller job dict sets (absent keys are left alone). Text
    longer than its column is cut: a long pending reason must not lose the whole event."""
    limits = _MAX_LENGTHS
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
    if job.get("spec") is not None:
        fields["spec"] = job["spec"]
    return fields
