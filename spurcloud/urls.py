from django.contrib import admin
from django.urls import include, path

from spurcloud.admin_login import admin_login
from spurcloud.billing.webhooks import stripe_webhook
from spurcloud.health import healthz

# Under /api/ every error is JSON; elsewhere Django's pages.
handler400 = "spurcloud.api.errors.bad_request"
handler403 = "spurcloud.api.errors.permission_denied"
handler404 = "spurcloud.api.errors.page_not_found"
handler500 = "spurcloud.api.errors.server_error"

urlpatterns = [
    path("healthz", healthz),
    # Before the admin's own routes: its sign-in, rate-limited (spurcloud/admin_login.py).
    path("admin/login/", admin_login, name="admin-login"),
    path("admin/", admin.site.urls),
    path("accounts/", include("allauth.urls")),
    path("api/", include("spurcloud.api.urls")),
    path("billing/stripe/webhook", stripe_webhook, name="stripe-webhook"),
    path("slurm/", include("spurcloud.slurmrestd.urls")),  # slurmrestd-compatible routes
    path("", include("spurcloud.portal.urls")),
]
