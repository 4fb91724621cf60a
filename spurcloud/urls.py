from django.contrib import admin
from django.urls import include, path

from spurcloud.health import healthz

urlpatterns = [
    path("healthz", healthz),
    path("admin/", admin.site.urls),
    path("accounts/", include("allauth.urls")),
    path("api/", include("spurcloud.api.urls")),
    path("", include("spurcloud.portal.urls")),
]
