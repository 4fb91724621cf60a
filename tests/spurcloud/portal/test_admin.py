"""The audit trail in the Django admin: readable by staff, and nobody adds, edits or
deletes an event there, one or many."""

from __future__ import annotations

from typing import Any

from spurcloud.tenants.models import AuditEvent
from tests.spurcloud.conftest import Tenant, make_user
from tests.spurcloud.portal.conftest import browser


def _superuser() -> Any:
    root = make_user("root", staff=True)
    root.is_superuser = True
    root.save()
    return root


def test_the_audit_log_is_read_only_in_the_admin(acme: Tenant) -> None:
    events = AuditEvent.objects.filter(organization=acme.organization)
    count = events.count()
    assert count > 0  # the organisation's creation, its member's addition
    event = events.first()
    assert event is not None
    admin = browser(_superuser())
    base = "/admin/tenants/auditevent/"
    listing = admin.get(base)
    assert listing.status_code == 200
    assert f'href="{base}add/"'.encode() not in listing.content
    assert b"delete_selected" not in listing.content  # no bulk delete
    assert admin.get(f"{base}add/").status_code == 403
    assert admin.post(f"{base}add/", {"action": "job.cancelled"}).status_code == 403
    shown = admin.get(f"{base}{event.pk}/change/")
    assert shown.status_code == 200 and b'name="_save"' not in shown.content
    assert admin.post(f"{base}{event.pk}/change/", {"target": "forged"}).status_code == 403
    assert admin.get(f"{base}{event.pk}/delete/").status_code == 403
    admin.post(base, {"action": "delete_selected", "_selected_action": [e.pk for e in events]})
    assert events.count() == count
    event.refresh_from_db()
    assert event.target != "forged"
