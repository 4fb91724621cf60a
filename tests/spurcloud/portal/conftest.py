"""The portal seen from every side: the organisation's owner, an admin, a member, a
billing member, an outsider (another organisation's owner), and nobody signed in."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from spurcloud.jobs.services import record_job_event
from spurcloud.tenants.models import Membership
from spurcloud.tenants.services import add_member
from tests.spurcloud.conftest import Tenant, event, job_dict, make_user

# The fake agent (a small real HTTP server, registered with a real controller) of the
# API's output tests: the portal reads output through the same selector.
from tests.spurcloud.test_job_output import agent  # noqa: F401

# Who runs jobs; and everyone with a role in the organisation (billing sees, runs nothing).
RUNNERS = ["owner", "admin", "member"]
ROLES = [*RUNNERS, "billing"]
EVERYONE = [*ROLES, "outsider"]
# The header htmx sends with each of its requests: the view answers with a fragment.
HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def no_controller_unless_started(settings: Any) -> None:
    """Nothing listens on the discard port: a page that reads the controller without a
    test's own (`live_controller`, which points the site at it) sees an unreachable one,
    never whatever else on this machine listens on the default port."""
    settings.SPUR_CONTROLLER_URLS = ["http://127.0.0.1:9"]


def browser(user: Any | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def people(acme: Tenant, globex: Tenant) -> dict[str, Any]:
    admin, billing = make_user("ada"), make_user("bill")
    for user, role in ((admin, Membership.Role.ADMIN), (billing, Membership.Role.BILLING)):
        add_member(organization=acme.organization, user=user, role=role, by=acme.owner)
    return {
        "owner": acme.owner,
        "admin": admin,
        "member": acme.member,
        "billing": billing,
        "outsider": globex.owner,
    }


def record(job_id: int, *, tenant: str = "acme", user: str = "max", **changes: Any) -> None:
    """A job in the history, as the controller's event put it there."""
    record_job_event(event=event(job_dict(job_id, tenant=tenant, user=user, **changes)))
