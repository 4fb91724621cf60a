from django.templatetags.static import static
from django.urls import path, re_path
from django.views.generic.base import RedirectView

from agents.output import STREAMS
from scheduler.core.contract import JobAction
from spurcloud.api.urls import JobIdConverter  # noqa: F401  (registers <jobid:...>)
from spurcloud.portal import (
    account_views,
    billing_document_views,
    billing_views,
    invitation_join,
    job_views,
    jupyter_proxy,
    operator_views,
    organization_views,
    revenue_views,
    session_views,
    spend_alert_views,
    views,
)

app_name = "portal"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("jobs/", job_views.job_list, name="jobs"),
    path("jobs/<jobid:job_id>/", job_views.job_detail, name="job-detail"),
    # One path per action of the contract (`JobAction`), as in the API.
    *(
        path(
            f"jobs/<jobid:job_id>/{action.value}",
            job_views.job_action,
            {"action": action},
            name=f"job-{action.value}",
        )
        for action in JobAction
    ),
    *(
        path(
            f"jobs/<jobid:job_id>/{stream}",
            job_views.job_output_download,
            {"stream": stream},
            name=f"job-{stream}",
        )
        for stream in STREAMS
    ),
    path("launch/", job_views.launch, name="launch"),
    path("sessions/launch", session_views.session_launch, name="session-launch"),
    path("sessions/<jobid:job_id>/", session_views.session_detail, name="session-detail"),
    path("sessions/<jobid:job_id>/status", session_views.session_status, name="session-status"),
    path("sessions/<jobid:job_id>/stop", session_views.session_stop, name="session-stop"),
    re_path(jupyter_proxy.PATH_PATTERN, jupyter_proxy.jupyter_http, name="session-jupyter"),
    path("account/", account_views.account, name="account"),
    re_path(
        r"^account/ssh-keys/(?P<key_id>[0-9]{1,18})/remove$",
        account_views.ssh_key_remove,
        name="ssh-key-remove",
    ),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", views.token_revoke, name="token-revoke"),
    path("nodes/", views.nodes, name="nodes"),
    path("operator/nodes/", operator_views.operator_nodes, name="operator-nodes"),
    path(
        "operator/nodes/<str:node>/drain",
        operator_views.operator_node_drain,
        name="operator-node-drain",
    ),
    path(
        "operator/nodes/<str:node>/resume",
        operator_views.operator_node_resume,
        name="operator-node-resume",
    ),
    path("operator/queue/", operator_views.operator_queue, name="operator-queue"),
    path("billing/", billing_views.billing, name="billing"),
    path("billing/topup", billing_views.topup, name="billing-topup"),
    path("billing/stripe-portal", billing_views.stripe_portal, name="billing-stripe-portal"),
    path("billing/alerts", spend_alert_views.spend_alert_add, name="billing-alert-add"),
    path(
        "billing/alerts/<jobid:alert_id>/delete",
        spend_alert_views.spend_alert_delete,
        name="billing-alert-delete",
    ),
    re_path(
        r"^billing/invoices/(?P<invoice_id>[0-9]{1,18})$",
        billing_views.invoice,
        name="billing-invoice",
    ),
    re_path(
        r"^billing/invoices/(?P<invoice_id>[0-9]{1,18})\.pdf$",
        billing_document_views.invoice_pdf_download,
        name="billing-invoice-pdf",
    ),
    re_path(
        r"^billing/invoices/(?P<invoice_id>[0-9]{1,18})/credit-notes/(?P<note_id>[0-9]{1,18})\.pdf$",
        billing_document_views.credit_note_pdf_download,
        name="billing-credit-note-pdf",
    ),
    path("revenue/", revenue_views.revenue, name="revenue"),
    path("revenue.csv", revenue_views.revenue_csv, name="revenue-csv"),
    path("invitations/", views.invitations, name="invitations"),
    path("invitations/accept/<str:secret>", views.invitation_accept, name="invitation-accept"),
    path("invitations/join", invitation_join.invitation_join, name="invitation-join"),
    path("organization/", organization_views.organization, name="organization"),
    re_path(  # at most 18 digits: always a 64-bit id, never a database error
        r"^organization/members/(?P<membership_id>[0-9]{1,18})/remove$",
        organization_views.member_remove,
        name="member-remove",
    ),
    re_path(
        r"^organization/members/(?P<membership_id>[0-9]{1,18})/role$",
        organization_views.member_role,
        name="member-role",
    ),
    path("organizations/new", views.organization_create, name="organization-create"),
    path("organizations/select", views.organization_select, name="organization-select"),
    # Browsers ask for /favicon.ico whatever the page says.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
]
