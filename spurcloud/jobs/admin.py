from django.contrib import admin

from spurcloud.jobs.models import JobRecord


@admin.register(JobRecord)
class JobRecordAdmin(admin.ModelAdmin):
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

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False
