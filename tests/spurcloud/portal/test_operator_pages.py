"""The operators' pages (portal/operator_views.py): nodes with drain and resume, and every
organisation's queue, for staff only; everyone else, whatever their role, is refused."""

from __future__ import annotations

from typing import Any

import pytest

from spurcloud.jobs.services import submit_job
from tests.fixtures.processes import wait_until
from tests.spurcloud.conftest import Tenant, make_user
from tests.spurcloud.portal.conftest import EVERYONE, browser


@pytest.fixture
def operator(db: None) -> Any:
    return make_user("olga", staff=True)


def _node(page: str) -> str:
    """The node01 row of the operators' node table."""
    return page.split('data-node="node01"')[1].split("</tr>")[0]


def test_an_operator_drains_a_node_with_a_reason_and_resumes_it(
    operator: Any, acme: Tenant, live_controller: Any
) -> None:
    staff = browser(operator)
    row = _node(staff.get("/operator/nodes/").content.decode())
    assert "state-idle" in row and "Drain node01" in row and "127.0.0.1:9" in row

    done = staff.post("/operator/nodes/node01/drain", {"reason": "GPU 0 ECC errors"}, follow=True)
    page = done.content.decode()
    assert "Node node01 drained: it takes no new job." in page
    row = _node(page)
    assert "state-drain" in row and "GPU 0 ECC errors" in row and "Resume node01" in row
    # Tenants see the state and the reason too (as sinfo -R shows them).
    assert "GPU 0 ECC errors" in browser(acme.member).get("/nodes/").content.decode()
    # No new job goes there.
    job = submit_job(
        organization=acme.organization, user=acme.member, spec={"script": "#!/bin/sh\n", "gpus": 1}
    )
    with live_controller.client() as client:
        # Once a pass has looked at it (it gives a pending job its reason), it still waits.
        wait_until(lambda: client.job(job["job_id"])["reason"] not in ("", None), what="a pass")
        assert client.job(job["job_id"])["state"] == "PENDING"

    page = staff.post("/operator/nodes/node01/resume", follow=True).content.decode()
    assert "Node node01 resumed: it takes jobs again." in page
    assert "state-drain" not in _node(page)


def test_a_drain_without_a_reason_changes_nothing(operator: Any, live_controller: Any) -> None:
    page = browser(operator).post("/operator/nodes/node01/drain", {"reason": " "}, follow=True)
    assert "not drained: a drain needs a reason" in page.content.decode()
    with live_controller.client() as client:
        assert client.nodes()[0]["state"] == "idle"


def test_an_unknown_node_is_not_found(operator: Any, live_controller: Any) -> None:
    staff = browser(operator)
    assert staff.post("/operator/nodes/nope/drain", {"reason": "x"}).status_code == 404
    assert staff.post("/operator/nodes/nope/resume").status_code == 404


def test_an_operator_sees_every_organisations_queue(
    operator: Any, acme: Tenant, globex: Tenant, live_controller: Any
) -> None:
    for tenant in (acme, globex):
        submit_job(
            organization=tenant.organization,
            user=tenant.owner,
            spec={"script": "#!/bin/sh\nsleep 600\n", "name": f"{tenant.organization.slug}-job"},
        )
    page = browser(operator).get("/operator/queue/").content.decode()
    assert "acme-job" in page and "globex-job" in page


def test_an_unreachable_scheduler_is_said_plainly(operator: Any) -> None:
    staff = browser(operator)
    for path in ("/operator/nodes/", "/operator/queue/"):
        response = staff.get(path)
        assert response.status_code == 200 and b"scheduler" in response.content, path
    refused = staff.post("/operator/nodes/node01/drain", {"reason": "x"}, follow=True)
    assert b"Node node01:" in refused.content


@pytest.mark.parametrize("who", EVERYONE)
def test_no_one_but_staff_may_see_or_drain(
    who: str, people: dict[str, Any], acme: Tenant, live_controller: Any
) -> None:
    client = browser(people[who])
    for path in ("/operator/nodes/", "/operator/queue/"):
        response = client.get(path)
        assert response.status_code == 403, path
    assert client.post("/operator/nodes/node01/drain", {"reason": "mine"}).status_code == 403
    assert client.post("/operator/nodes/node01/resume").status_code == 403
    with live_controller.client() as client:
        assert client.nodes()[0]["state"] == "idle"
    assert "Operate" not in browser(people[who]).get("/").content.decode()


def test_nobody_signed_in_is_sent_to_sign_in(db: None) -> None:
    response = browser(None).get("/operator/nodes/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert browser(None).post("/operator/nodes/node01/drain", {"reason": "x"}).status_code == 302
