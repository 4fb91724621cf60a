"""The billing role, wherever jobs are written: a billing member reads the organisation's
jobs but submits and controls none, through the API as through the portal."""

from __future__ import annotations

from typing import Any

import pytest

from spurcloud.jobs.services import BILLING_ROLE_MESSAGE, submit_job
from spurcloud.tenants.models import Membership
from spurcloud.tenants.services import add_member
from tests.spurcloud.conftest import Tenant, api_client, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def billing(acme: Tenant) -> Any:
    user = make_user("bill")
    add_member(organization=acme.organization, user=user, role=Membership.Role.BILLING)
    return api_client(user, acme.organization)


def test_a_billing_member_cannot_submit(billing: Any) -> None:
    response = billing.post("/api/v1/jobs", {"script": "#!/bin/sh\ntrue\n"}, format="json")
    assert response.status_code == 403
    assert response.json()["detail"] == BILLING_ROLE_MESSAGE


def test_a_billing_member_reads_jobs_but_controls_none(
    acme: Tenant, billing: Any, live_controller: Any
) -> None:
    job = submit_job(
        organization=acme.organization,
        user=acme.owner,
        spec={"script": "#!/bin/sh\ntrue\n", "hold": True},
    )
    assert billing.get(f"/api/v1/jobs/{job['job_id']}").status_code == 200
    for action in ("cancel", "release"):
        response = billing.post(f"/api/v1/jobs/{job['job_id']}/{action}", {}, format="json")
        assert response.status_code == 403
        assert response.json()["detail"] == BILLING_ROLE_MESSAGE
