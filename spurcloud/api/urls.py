"""The API's routes. Each of the contract's job actions (`JobAction`) has its path; every
other path under /api/ answers a JSON 404."""

from django.urls import path, re_path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from scheduler.core.contract import JobAction
from spurcloud.api import (
    billing,
    billing_documents,
    cluster,
    errors,
    nodes,
    step_nodes,
    steps,
    views,
)
from spurcloud.api.throttling import IpRateThrottle


class JobIdConverter:
    """A job id: at most 18 digits, so it always fits the history's 64-bit column (a
    longer one is a 404 like any other unknown job, never a database error)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(JobIdConverter, "jobid")

app_name = "api"

urlpatterns = [
    path("v1/jobs", views.JobsApi.as_view(), name="jobs"),
    path("v1/jobs/<jobid:job_id>", views.JobDetailApi.as_view(), name="job-detail"),
    path("v1/jobs/<jobid:job_id>/output", views.JobOutputApi.as_view(), name="job-output"),
    # One path and one operation per action of the contract (`JobAction`).
    *(
        path(
            f"v1/jobs/<jobid:job_id>/{action.value}",
            views.JobActionApi.as_view(),
            {"action": action},
            name=f"job-{action.value}",
        )
        for action in JobAction
    ),
    # Job steps (srun, salloc): spurcloud/api/steps.py
    path("v1/jobs/<jobid:job_id>/steps", steps.StepsApi.as_view(), name="job-steps"),
    path(
        "v1/jobs/<jobid:job_id>/steps/<int:step_id>/cancel",
        steps.StepCancelApi.as_view(),
        name="job-step-cancel",
    ),
    *(
        path(
            f"v1/jobs/<jobid:job_id>/steps/<int:step_id>/{name}",
            view.as_view(),
            name=f"job-step-{name}",
        )  # fmt: skip
        for name, view in (
            ("attach", step_nodes.StepAttachApi),
            ("input", step_nodes.StepInputApi),
            ("resize", step_nodes.StepResizeApi),
            ("signal", step_nodes.StepSignalApi),
            ("end", steps.StepEndApi),
        )
    ),
    path("v1/queue", views.QueueApi.as_view(), name="queue"),
    path("v1/nodes", views.NodesApi.as_view(), name="nodes"),
    # scontrol update NodeName=... State=DRAIN|RESUME (operators): spurcloud/api/nodes.py
    re_path(
        rf"^v1/nodes/(?P<name>{nodes.NODE_NAME_PATTERN})$",
        nodes.NodeUpdateApi.as_view(),
        name="node-update",
    ),
    path("v1/partitions", views.PartitionsApi.as_view(), name="partitions"),
    # The admin commands' reads (scontrol, sprio, sshare, sacctmgr): spurcloud/api/cluster.py
    path("v1/queue/<jobid:job_id>", cluster.LiveJobDetailApi.as_view(), name="queue-detail"),
    path("v1/ping", cluster.PingApi.as_view(), name="ping"),
    path("v1/config", cluster.ConfigApi.as_view(), name="config"),
    path("v1/priorities", cluster.PrioritiesApi.as_view(), name="priorities"),
    path("v1/shares", cluster.SharesApi.as_view(), name="shares"),
    path("v1/associations", cluster.AssociationsApi.as_view(), name="associations"),
    path("v1/qos", cluster.QosApi.as_view(), name="qos"),
    path("v1/topology", cluster.TopologyApi.as_view(), name="topology"),
    # Billing: spurcloud/api/billing.py
    path("v1/billing/balance", billing.BalanceApi.as_view(), name="billing-balance"),
    path("v1/billing/prices", billing.PricesApi.as_view(), name="billing-prices"),
    path("v1/billing/ledger", billing.LedgerApi.as_view(), name="billing-ledger"),
    path("v1/billing/usage", billing.UsageApi.as_view(), name="billing-usage"),
    path("v1/billing/topups", billing.TopUpsApi.as_view(), name="billing-topups"),
    path("v1/billing/portal", billing.PortalApi.as_view(), name="billing-portal"),
    path("v1/billing/invoices", billing.InvoicesApi.as_view(), name="billing-invoices"),
    path(
        "v1/billing/invoices/<jobid:invoice_id>",
        billing.InvoiceDetailApi.as_view(),
        name="billing-invoice",
    ),
    path(
        "v1/billing/invoices/<jobid:invoice_id>/html",
        billing.InvoiceHtmlApi.as_view(),
        name="billing-invoice-html",
    ),
    path(
        "v1/billing/invoices/<jobid:invoice_id>/pdf",
        billing_documents.InvoicePdfApi.as_view(),
        name="billing-invoice-pdf",
    ),
    path(
        "v1/billing/invoices/<jobid:invoice_id>/credit-notes/<jobid:note_id>/pdf",
        billing_documents.CreditNotePdfApi.as_view(),
        name="billing-credit-note-pdf",
    ),
    # Open to all, so limited per client address: building the schema is not free.
    path(
        "schema/",
        SpectacularAPIView.as_view(
            authentication_classes=[], permission_classes=[], throttle_classes=[IpRateThrottle]
        ),
        name="schema",
    ),
    # The split view serves its start-up script as a file of its own (`?script`), not
    # inline, and our template links its page styles: the Content-Security-Policy
    # (spurcloud/headers.py) allows no inline script or style.
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(
            url_name="api:schema",
            template_name="api/swagger_ui.html",
            authentication_classes=[],
            permission_classes=[],
            throttle_classes=[IpRateThrottle],
        ),
        name="docs",
    ),
    re_path(r"^", errors.not_found, name="not-found"),
]
