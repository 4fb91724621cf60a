from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest

from spurcloud.jobs.models import JobRecord

# Django's ModelAdmin is generic only in its stubs (subscripting it at run time fails).
if TYPE_CHECKING:
    _JobRecordAdmin = admin.ModelAdmin[JobRecord]
else:
    _JobRecordAdmin = admin.ModelAdmin


@admin.register(JobRecord)
class JobRecordAdmin(_JobRecordAdmin):
    list_display = [
        "job_id",
        "organization",
        "user",
        "name",
        "partition",
        "state",
        "num_gpus",
        "submit_time",
        "end_time",
    ]
    list_filter = ["state", "partition", "cluster"]
    list_select_related = ["organization"]
    search_fields = ["=job_id", "name", "user", "organization__slug"]
    raw_id_fields = ["organization"]
    # The record mirrors the controller; editing it here would only be overwritten (or,
    # worse, not be), so it is read-only.
    readonly_fields = [f.name for f in JobRecord._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
