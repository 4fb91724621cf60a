from django.urls import path

from spurcloud.portal import views

app_name = "portal"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", views.token_revoke, name="token-revoke"),
    path("nodes/", views.nodes, name="nodes"),
    path("invitations/", views.invitations, name="invitations"),
    path("invitations/accept/<str:secret>", views.invitation_accept, name="invitation-accept"),
    path("organizations/new", views.organization_create, name="organization-create"),
    path("organizations/select", views.organization_select, name="organization-select"),
]
