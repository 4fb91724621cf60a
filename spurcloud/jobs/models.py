"""The job history: a mirror of the controller's job events (what `sacct` reads).

A job's states, their labels and groups come from the contract
(`scheduler.core.contract.JobState`): the field's choices and the database constraint
are built from it, and `makemigrations --check` (a test) fails when a migration is
missing for a change there.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from scheduler.core.contract import ACTIVE, TERMINAL, JobState
from spurcloud.tenants.models import Organization

STATE_CHOICES = [(s.value, s.label) for s in JobState]
STATE_VALUES = [s.value for s in JobState]
ACTIVE_STATES: frozenset[str] = frozenset(s.value for s in ACTIVE)
TERMINAL_STATES: frozenset[str] = frozenset(s.value for s in TERMINAL)


class JobRecord(models.Model):
    cluster = models.CharField(max_length=64)
    job_id = models.PositiveBigIntegerField()
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="jobs")
    user = models.CharField(max_length=150, help_text="The submitter's user name.")
    name = models.CharField(max_length=200, blank=True)
    partition = models.CharField(max_length=64, blank=True)
    account = models.CharField(max_length=64, blank=True)
    qos = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=STATE_CHOICES, default=JobState.PENDING.value)
    reason = models.CharField(max_length=200, blank=True)
    submit_time = models.DateTimeField(null=True, blank=True)
    eligible_time = models.DateTimeField(null=True, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    time_limit_min = models.PositiveIntegerField(null=True, blank=True)
    nodes = models.JSONField(default=list, blank=True, help_text="Node names, allocation order.")
    num_nodes = models.PositiveIntegerField(default=0)
    num_cpus = models.PositiveIntegerField(default=0)
    num_gpus = models.PositiveIntegerField(default=0)
    gpu_milli = models.PositiveBigIntegerField(
        default=0, help_text="GPU capacity held, in thousandths of a GPU."
    )
    allocation = models.JSONField(default=dict, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.IntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    limits = models.CharField(
        max_length=32, blank=True, help_text="How memory and process limits were enforced."
    )
    # A task of a job array: shown as <array_job_id>_<array_task_id> (sacct, squeue).
    array_job_id = models.PositiveIntegerField(null=True, blank=True)
    array_task_id = models.PositiveIntegerField(null=True, blank=True)
    # An array's pending remainder (one row for its tasks, as sacct shows it: 123_[5-9]):
    # the task ids it stands for; "" for any other job. A task that leaves it gets its
    # own row (the first one left takes this row's job id with it).
    array_tasks = models.CharField(max_length=8192, blank=True, default="")
    workdir = models.TextField(blank=True)
    stdout = models.TextField(blank=True)
    stderr = models.TextField(blank=True)
    spec = models.JSONField(null=True, blank=True, help_text="The JobSpec as submitted.")
    interactive = models.BooleanField(
        default=False, help_text="An allocation of salloc or srun: no batch step."
    )
    steps = models.JSONField(
        default=list, blank=True, help_text="Its job steps (srun), as the job object's `steps`."
    )
    last_seq = models.BigIntegerField(
        default=0, help_text="Sequence number of the last event applied (0: none yet)."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-job_id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "job_id"], name="jobrecord_one_per_job"),
            models.CheckConstraint(
                condition=Q(state__in=STATE_VALUES), name="jobrecord_state_valid"
            ),
            models.CheckConstraint(condition=Q(last_seq__gte=0), name="jobrecord_seq_not_negative"),
        ]
        indexes = [
            # The history list and the dashboard: one organisation's jobs, newest first.
            models.Index(fields=["organization", "-job_id"], name="jobrecord_org_recent"),
            # sacct's --starttime/--endtime window.
            models.Index(fields=["organization", "submit_time"], name="jobrecord_org_submit"),
            # The live dashboard's poll (in-memory layer): rows changed since a sequence.
            models.Index(fields=["organization", "last_seq"], name="jobrecord_org_seq"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES


class HistoryVersion(models.Model):
    """How often an organisation's job history (its JobRecords) has changed: the key of
    the history list's kept answers (`spurcloud.jobs.kept`).

    The database keeps it, not the code: triggers on the JobRecord table (migration 0008)
    bump it in the same transaction as any insert, update or delete, whoever writes (the
    event mirror, a submission, the admin, a script), so no writer can forget to. A
    reader reads it before the rows: rows read after a version are at least as new as it.
    (A TRUNCATE fires no row trigger: the platform never truncates the history.)
    An organisation's first change starts it at a random number, so a history made again
    (a test database flushed, an organisation id reused) never meets an old kept answer.

    Not a foreign key: the triggers write it while an organisation's jobs are deleted
    with it, after which a row of a gone organisation is harmless."""

    organization_id = models.BigIntegerField(primary_key=True)
    version = models.BigIntegerField()

    def __str__(self) -> str:
        return f"organisation {self.organization_id}: history version {self.version}"
