from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from spurcloud.api import views

app_name = "api"

urlpatterns = [
    path("v1/jobs", views.JobsApi.as_view(), name="jobs"),
    path("v1/jobs/<int:job_id>", views.JobDetailApi.as_view(), name="job-detail"),
    path("v1/jobs/<int:job_id>/cancel", views.JobCancelApi.as_view(), name="job-cancel"),
    re_path(
        r"^v1/jobs/(?P<job_id>[0-9]+)/(?P<action>hold|release|requeue|requeuehold)$",
        views.JobControlApi.as_view(),
        name="job-control",
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
]
