"""The API's shapes, built from the job contract (`scheduler.core.contract`): the request
body of a submission from `SPEC_FIELDS`, the job object from `JOB_FIELDS`, the states and
actions from their enums. Nothing here lists a field by hand, so the OpenAPI schema
cannot drift from what the core accepts and answers (tests/spurcloud/test_contract_layers
checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers

from scheduler.core.contract import (
    GPU_FRACTION,
    JOB_FIELDS,
    MAX_SIGNAL,
    MIN_SIGNAL,
    SPEC_FIELDS,
    FieldDef,
    JobField,
    JobSpec,
    JobState,
    Kind,
)
from scheduler.core.errors import InvalidSpec

STATE_CHOICES = [s.value for s in JobState]


class ErrorSerializer(serializers.Serializer[Any]):
    detail = serializers.CharField(help_text="What went wrong, for a person to read.")
    code = serializers.CharField(required=False, help_text="A stable word for programs.")
    # The serializer's metaclass moves declared fields out of the class, so this field
    # does not replace `Serializer.errors`; the stubs cannot know that.
    errors = serializers.DictField(  # type: ignore[assignment]
        required=False, help_text="Per field: the problems with it (validation errors)."
    )


class AllocationSerializer(serializers.Serializer[Any]):
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="GPU indices.")
    cpus = serializers.IntegerField()
    mem_mb = serializers.IntegerField()
    gpu_milli = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="Thousandths of each GPU held (a share of one GPU).",
    )
    cpu_ids = serializers.ListField(
        child=serializers.IntegerField(), required=False, help_text="The CPUs it is bound to."
    )


def _whole(bound: float | None) -> int | None:
    """An integer field's bound, which the contract gives as a whole number."""
    if bound is None or isinstance(bound, int):
        return bound
    raise TypeError(f"an integer field's bound must be a whole number, not {bound!r}")


def _spec_field(f: FieldDef) -> serializers.Field[Any, Any, Any, Any]:
    """The request field of one spec field, with its bounds."""
    b = f.bounds
    common: dict[str, Any] = {"required": False, "help_text": b.help}
    if f.nullable:
        common["allow_null"] = True
    if f.kind is Kind.STRING:
        return serializers.CharField(
            allow_blank=True, trim_whitespace=False, max_length=b.max_length, **common
        )
    if f.kind is Kind.INTEGER:
        return serializers.IntegerField(
            min_value=_whole(b.minimum), max_value=_whole(b.maximum), **common
        )
    if f.kind is Kind.NUMBER:
        return serializers.FloatField(min_value=b.minimum, max_value=b.maximum, **common)
    if f.kind is Kind.BOOLEAN:
        return serializers.BooleanField(**common)
    item = serializers.CharField(
        allow_blank=True, trim_whitespace=False, max_length=b.item_max_length
    )
    if f.kind is Kind.STRINGS:
        return serializers.ListField(child=item, max_length=b.max_length, **common)
    if f.kind is Kind.STRING_MAP:
        return serializers.DictField(child=item, **common)
    raise TypeError(f"no request field for {f.kind}")


class JobSpecSerializer(serializers.Serializer[Any]):
    """The body of POST /api/v1/jobs: a JobSpec without tenant and user (the token says
    who submits). Validation is the core's own (`JobSpec.from_dict`): strict types, the
    bounds declared here, unknown fields refused; its message names the field."""

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = {f.name: _spec_field(f) for f in SPEC_FIELDS if not f.bounds.stamped}
        fields["script"].required = True
        fields[GPU_FRACTION.name] = _spec_field(GPU_FRACTION)
        return fields

    def to_internal_value(self, data: Any) -> JobSpec:
        try:
            return JobSpec.from_dict(data)
        except InvalidSpec as exc:
            raise serializers.ValidationError(
                {exc.field or "non_field_errors": [exc.message]}
            ) from exc


def _answer_field(f: JobField, *, listed: bool = False) -> serializers.Field[Any, Any, Any, Any]:
    common: dict[str, Any] = {"help_text": f.help}
    if f.nullable:
        common["allow_null"] = True
    if not f.always or (listed and f.name != "job_id"):
        common["required"] = False
    if f.name == "state":
        return serializers.ChoiceField(choices=STATE_CHOICES, **common)
    if f.name == "allocation":
        return serializers.DictField(child=AllocationSerializer(), **common)
    kinds: dict[Kind, Callable[[], serializers.Field[Any, Any, Any, Any]]] = {
        Kind.STRING: lambda: serializers.CharField(allow_blank=True, **common),
        Kind.INTEGER: lambda: serializers.IntegerField(**common),
        Kind.NUMBER: lambda: serializers.FloatField(**common),
        Kind.BOOLEAN: lambda: serializers.BooleanField(**common),
        Kind.TIME: lambda: serializers.DateTimeField(**common),
        Kind.STRINGS: lambda: serializers.ListField(child=serializers.CharField(), **common),
        Kind.OBJECT: lambda: serializers.JSONField(**common),
    }
    return kinds[f.kind]()


def _job_serializer(
    name: str, fields: tuple[JobField, ...], doc: str, *, listed: bool = False
) -> type[Any]:
    """`listed`: a job of a list answer, which holds only the fields asked for where the
    request names them (`?fields=`)."""
    if listed:
        doc += " A list's job holds only the fields its request names (`fields`), if any."
    return type(
        name,
        (serializers.Serializer,),
        {"__doc__": doc, **{f.name: _answer_field(f, listed=listed) for f in fields}},
    )


_HISTORY_DOC = "A job from the history (what sacct reads), with ISO 8601 UTC times."
_LIVE_DOC = "A job as the controller has it now (what squeue reads), with ISO 8601 UTC times."
_HISTORY = tuple(f for f in JOB_FIELDS if f.history)
JobSerializer = _job_serializer("Job", _HISTORY, _HISTORY_DOC)
LiveJobSerializer = _job_serializer("LiveJob", JOB_FIELDS, _LIVE_DOC)
ListedJobSerializer = _job_serializer("ListedJob", _HISTORY, _HISTORY_DOC, listed=True)
ListedLiveJobSerializer = _job_serializer("ListedLiveJob", JOB_FIELDS, _LIVE_DOC, listed=True)


def _column_field(f: JobField) -> serializers.Field[Any, Any, Any, Any]:
    """One column of a columns answer: the field's values, a time as epoch seconds, null
    where the field is nullable or only some jobs carry it."""
    kinds: dict[Kind, Callable[[], serializers.Field[Any, Any, Any, Any]]] = {
        Kind.STRING: lambda: serializers.CharField(allow_blank=True, allow_null=True),
        Kind.INTEGER: lambda: serializers.IntegerField(allow_null=True),
        Kind.NUMBER: lambda: serializers.FloatField(allow_null=True),
        Kind.BOOLEAN: lambda: serializers.BooleanField(allow_null=True),
        Kind.TIME: lambda: serializers.IntegerField(allow_null=True),
        Kind.STRINGS: lambda: serializers.ListField(child=serializers.CharField(), allow_null=True),
        Kind.OBJECT: lambda: serializers.JSONField(allow_null=True),
    }
    help_text = f.help + (" (epoch seconds)" if f.kind is Kind.TIME else "")
    return ColumnField(child=kinds[f.kind](), required=False, help_text=help_text)


class ColumnField(serializers.ListField):
    """One column of a columns answer: its values, or with `shape=runs` their runs
    (`contract.runs`; its schema: `schema.ColumnRuns`)."""


def _columns_serializer(name: str, fields: tuple[JobField, ...], doc: str) -> type[Any]:
    """A list answer of `?shape=columns` or `runs`: `n` jobs, each field asked for a list
    of `n` values in the list's order (`contract.job_object.to_columns`), or its runs
    (`shape=runs`: `contract.runs`)."""
    columns = type(
        f"{name}Columns",
        (serializers.Serializer,),
        {"__doc__": "The fields asked for, each a list (or its runs).", **{
            f.name: _column_field(f) for f in fields}},
    )  # fmt: skip
    return type(
        name,
        (serializers.Serializer,),
        {
            "__doc__": doc,
            "n": serializers.IntegerField(min_value=0, help_text="Jobs in this answer."),
            "next": serializers.URLField(allow_null=True, help_text="The next page, or null."),
            "columns": columns(),
        },
    )


JobColumnsSerializer = _columns_serializer(
    "JobColumns", _HISTORY, "Jobs from the history as columns (what sacct reads)."
)
LiveJobColumnsSerializer = _columns_serializer(
    "LiveJobColumns", JOB_FIELDS, "Jobs as the controller has them now, as columns (squeue)."
)


class ClosedSerializer(serializers.Serializer[Any]):
    """A request body that is an object of exactly these fields: anything else is refused
    by name (the schema says `additionalProperties: false`)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {"non_field_errors": [f"unknown field(s): {', '.join(unknown)}"]}
                )
        return super().to_internal_value(data)


class JobCancelSerializer(ClosedSerializer):
    signal = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=MIN_SIGNAL,
        max_value=MAX_SIGNAL,
        help_text="cancel only: send this signal instead of cancelling (scancel --signal).",
    )


class NodeGpuSerializer(serializers.Serializer[Any]):
    """A GPU of a node, as a tenant sees it (`jobs.selectors.TENANT_GPU_KEYS`)."""

    index = serializers.IntegerField(help_text="Its index on the node (what jobs are given).")
    vendor = serializers.CharField()
    model = serializers.CharField(help_text="What --gres=gpu:<model>:N names.")
    memory_mb = serializers.IntegerField()
    profile = serializers.CharField(
        required=False, help_text="A hardware partition's kind (MIG, CPX), when it is one."
    )


class NodeSerializer(serializers.Serializer[Any]):
    """A node as a tenant sees it (`jobs.selectors.TENANT_NODE_KEYS`): its size, GPU
    models, partitions, state and how much of it is allocated. Not how to reach its agent,
    its hardware addresses, nor which devices other jobs hold. An operator's answer is the
    controller's whole node dict: these keys and more (agent_url, gpus_in_use, ...)."""

    name = serializers.CharField()
    state = serializers.ChoiceField(choices=["idle", "mix", "alloc", "down", "drain"])
    reason = serializers.CharField(allow_blank=True)
    cpus = serializers.IntegerField()
    memory_mb = serializers.IntegerField()
    sockets = serializers.IntegerField()
    cores_per_socket = serializers.IntegerField()
    threads_per_core = serializers.IntegerField()
    features = serializers.ListField(child=serializers.CharField())
    partitions = serializers.ListField(child=serializers.CharField(), required=False)
    cpus_alloc = serializers.IntegerField(help_text="CPUs allocated to jobs, all together.")
    memory_alloc_mb = serializers.IntegerField()
    gpus_alloc = serializers.IntegerField(help_text="GPUs with any share allocated.")
    gpus = NodeGpuSerializer(many=True)


class JobOutputSerializer(serializers.Serializer[Any]):
    """A chunk of a job's output, as the agent of its first node read it."""

    job_id = serializers.IntegerField()
    attempt = serializers.IntegerField(help_text="The run of the job this output is of.")
    stream = serializers.ChoiceField(choices=["stdout", "stderr"])
    offset = serializers.IntegerField(help_text="Where this chunk starts, in bytes.")
    next_offset = serializers.IntegerField(help_text="The offset to ask for next.")
    size = serializers.IntegerField(help_text="The output's size so far, in bytes.")
    # Like ErrorSerializer.errors: a declared field, which does not replace `.data`.
    data = serializers.CharField(  # type: ignore[assignment]
        allow_blank=True, help_text="The chunk, as text."
    )
    running = serializers.BooleanField(help_text="Whether the job still runs (more may come).")


class PartitionSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    default = serializers.BooleanField()
    state = serializers.CharField()
    max_time_min = serializers.IntegerField(allow_null=True)
    default_time_min = serializers.IntegerField(allow_null=True)
    nodes = serializers.ListField(child=serializers.CharField())
