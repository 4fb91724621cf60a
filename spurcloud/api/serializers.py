"""Shapes shared by several API views: the job object, errors. Per-view input serializers
live in the view that takes them."""

from __future__ import annotations

from rest_framework import serializers

from spurcloud.jobs.models import JobState


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


class AllocationSerializer(serializers.Serializer):
    gpus = serializers.ListField(child=serializers.IntegerField())
    cpus = serializers.IntegerField()
    mem_mb = serializers.IntegerField()


class JobSerializer(serializers.Serializer):
    """The job object: the controller's job dict with ISO 8601 UTC times. Views answer with
    the dict itself (the controller may add keys; clients ignore what they do not know);
    this serializer documents it in the OpenAPI schema."""

    job_id = serializers.IntegerField()
    name = serializers.CharField()
    tenant = serializers.CharField()
    user = serializers.CharField()
    account = serializers.CharField()
    partition = serializers.CharField()
    qos = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)
    reason = serializers.CharField(help_text='Slurm\'s pending reason ("None" when not pending).')
    submit_time = serializers.DateTimeField(allow_null=True)
    eligible_time = serializers.DateTimeField(allow_null=True)
    start_time = serializers.DateTimeField(allow_null=True)
    end_time = serializers.DateTimeField(allow_null=True)
    time_limit_min = serializers.IntegerField(allow_null=True, help_text="null: unlimited.")
    nodes = serializers.ListField(child=serializers.CharField())
    num_nodes = serializers.IntegerField()
    num_cpus = serializers.IntegerField()
    num_gpus = serializers.IntegerField()
    gpu_type = serializers.CharField(required=False)
    allocation = serializers.DictField(child=AllocationSerializer())
    exit_code = serializers.IntegerField(allow_null=True)
    signal = serializers.IntegerField(allow_null=True)
    attempt = serializers.IntegerField()
    workdir = serializers.CharField()
    stdout = serializers.CharField(help_text="Output pattern (%j is the job id).")
    stderr = serializers.CharField(help_text='Error pattern; "" means the same as stdout.')
    comment = serializers.CharField(required=False)
    seq = serializers.IntegerField(help_text="Sequence number of the job's last change.")


class JobWithSpecSerializer(JobSerializer):
    spec = serializers.JSONField(help_text="The JobSpec as submitted.")


class JobSpecSerializer(serializers.Serializer):
    """The body of POST /api/v1/jobs: a JobSpec (scheduler/core/jobspec.py) without tenant
    and user. The service parses it with `JobSpec.from_dict`, which is stricter than this
    description (unknown fields are refused)."""

    script = serializers.CharField(help_text="The batch script, with its #! line.")
    name = serializers.CharField(required=False)
    argv = serializers.ListField(child=serializers.CharField(), required=False)
    workdir = serializers.CharField(required=False)
    submit_host = serializers.CharField(required=False)
    environment = serializers.DictField(child=serializers.CharField(), required=False)
    stdout = serializers.CharField(required=False)
    stderr = serializers.CharField(required=False)
    stdin = serializers.CharField(required=False)
    partition = serializers.CharField(required=False)
    account = serializers.CharField(required=False)
    qos = serializers.CharField(required=False)
    time_limit_min = serializers.IntegerField(required=False, allow_null=True)
    nodes = serializers.IntegerField(required=False, min_value=1)
    ntasks = serializers.IntegerField(required=False, min_value=1)
    cpus_per_task = serializers.IntegerField(required=False, min_value=1)
    mem_per_node_mb = serializers.IntegerField(required=False, allow_null=True)
    gpus_per_node = serializers.IntegerField(required=False, min_value=0)
    gpus = serializers.IntegerField(required=False, min_value=0)
    gpu_type = serializers.CharField(required=False)
    comment = serializers.CharField(required=False)
    requeue = serializers.BooleanField(required=False)


class NodeSerializer(serializers.Serializer):
    """A node dict (NodeSpec plus its live state); passed through from the controller."""

    name = serializers.CharField()
    state = serializers.ChoiceField(choices=["idle", "mix", "alloc", "down", "drain"])
    reason = serializers.CharField()
    cpus_alloc = serializers.IntegerField()
    memory_alloc_mb = serializers.IntegerField()
    gpus_alloc = serializers.IntegerField()
    gpus_in_use = serializers.ListField(child=serializers.IntegerField())
    partitions = serializers.ListField(child=serializers.CharField(), required=False)
    last_seen = serializers.FloatField(required=False, help_text="Epoch seconds.")


class PartitionSerializer(serializers.Serializer):
    name = serializers.CharField()
    default = serializers.BooleanField()
    state = serializers.CharField()
    max_time_min = serializers.IntegerField(allow_null=True)
    default_time_min = serializers.IntegerField(allow_null=True)
    nodes = serializers.ListField(child=serializers.CharField())
