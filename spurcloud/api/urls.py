"""The API's routes. Job actions are one pattern whose action segment is built from the
contract's `JobAction`; every other path under /api/ answers a JSON 404."""

from django.urls import path, re_path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from scheduler.core.contract import JobAction
from spurcloud.api import errors, views


class JobIdConverter:
    """A job id: at most 18 digits, so it always fits the history's 64-bit column (a
    longer one is a 404 like any other unknown job, never a database error)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


class JobActionConverter:
    """One of the contract's job actions, by name."""

    regex = "|".join(a.value for a in JobAction)

    def to_python(self, value: str) -> JobAction:
        return JobAction(value)

    def to_url(self, value: JobAction) -> str:
        return JobAction(value).value


register_converter(JobIdConverter, "jobid")
register_converter(JobActionConverter, "jobaction")

app_name = "api"

urlpatterns = [
    path("v1/jobs", views.JobsApi.as_view(), name="jobs"),
    path("v1/jobs/<jobid:job_id>", views.JobDetailApi.as_view(), name="job-detail"),
    path(
        "v1/jobs/<jobid:job_id>/<jobaction:action>",
        views.JobActionApi.as_view(),
        name="job-action",
    ),
    path("v1/queue", views.QueueApi.as_view(), name="queue"),
    path("v1/nodes", views.NodesApi.as_view(), name="nodes"),
    path("v1/partitions", views.PartitionsApi.as_view(), name="partitions"),
    path(
        "schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
        name="schema",
    ),
    path(
        "docs/",
        SpectacularSwaggerView.as_view(
            url_name="api:schema", authentication_classes=[], permission_classes=[]
        ),
        name="docs",
    ),
    re_path(r"^", errors.not_found, name="not-found"),
]
