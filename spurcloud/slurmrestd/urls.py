"""The slurmrestd routes, under /slurm/ (spurcloud/urls.py): each of slurmrestd's paths
for every version served (`envelope.VERSIONS`), with or without the trailing slash
slurmrestd's OpenAPI documents give some of them. Any other path is a 404 in
slurmrestd's shape."""

from django.urls import re_path

from spurcloud.slurmrestd import views
from spurcloud.slurmrestd.envelope import VERSION_RE

V = rf"^(?P<version>{VERSION_RE})"
NAME = r"[A-Za-z0-9._-]{1,255}"

app_name = "slurmrestd"

urlpatterns = [
    re_path(rf"{V}/ping/?$", views.PingApi.as_view(), name="ping"),
    re_path(rf"{V}/diag/?$", views.DiagApi.as_view(), name="diag"),
    re_path(rf"{V}/jobs/?$", views.JobsApi.as_view(), name="jobs"),
    re_path(rf"{V}/job/submit/?$", views.SubmitApi.as_view(), name="job-submit"),
    re_path(rf"{V}/job/(?P<job_id>[^/]{{1,64}})/?$", views.JobApi.as_view(), name="job"),
    re_path(rf"{V}/nodes/?$", views.NodesApi.as_view(), name="nodes"),
    re_path(rf"{V}/node/(?P<node_name>{NAME})/?$", views.NodesApi.as_view(), name="node"),
    re_path(rf"{V}/partitions/?$", views.PartitionsApi.as_view(), name="partitions"),
    re_path(
        rf"{V}/partition/(?P<partition_name>{NAME})/?$",
        views.PartitionsApi.as_view(),
        name="partition",
    ),
    re_path(rf"{V}/", views.not_found, name="not-found-version"),
    re_path(r"^", views.not_found, name="not-found"),
]
