"""Drain and resume a node through the API (PATCH /api/v1/nodes/{name}) and `scontrol
update NodeName=... State=DRAIN|RESUME`: an operator's (a staff user's admin-scoped
token) alone; every tenant role, an outsider and a staff user's everyday token refused."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from scheduler.cli import scontrol
from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig
from scheduler.cli.console import UsageError
from spurcloud.tenants.models import Membership
from spurcloud.tenants.services import add_member, create_api_token
from tests.spurcloud.conftest import Tenant, make_user


def _token(user: Any, tenant: Tenant, scopes: set[str]) -> str:
    if not Membership.objects.filter(user=user, organization=tenant.organization).exists():
        add_member(organization=tenant.organization, user=user)
    _, secret = create_api_token(
        user=user, organization=tenant.organization, name="t", scopes=scopes
    )
    return secret


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def operator(acme: Tenant) -> APIClient:
    staff = make_user("olga", staff=True)
    return _client(_token(staff, acme, {"read", "jobs", "admin"}))


def _node_state(live_controller: Any) -> tuple[str, str]:
    with live_controller.client() as client:
        node = client.nodes()[0]
    return node["state"], node["reason"]


def test_an_operator_drains_a_node_with_a_reason_and_resumes_it(
    operator: APIClient, live_controller: Any
) -> None:
    drained = operator.patch(
        "/api/v1/nodes/node01", {"state": "drain", "reason": "fan"}, format="json"
    )
    assert drained.status_code == 200, drained.json()
    assert (drained.json()["state"], drained.json()["reason"]) == ("drain", "fan")
    assert _node_state(live_controller) == ("drain", "fan")
    resumed = operator.patch("/api/v1/nodes/node01", {"state": "resume"}, format="json")
    assert resumed.status_code == 200 and resumed.json()["state"] == "idle"


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("node01", {"state": "drain"}, 400, "a drain needs a reason"),
        ("node01", {"state": "down", "reason": "x"}, 400, "not a valid choice"),
        ("node01", {"state": "drain", "reason": "x" * 257}, 400, "256"),
        ("nope", {"state": "drain", "reason": "x"}, 404, "Invalid node name specified"),
    ],
)
def test_a_bad_update_is_refused_and_changes_nothing(
    operator: APIClient, live_controller: Any, path: str, body: dict, status: int, says: str
) -> None:
    response = operator.patch(f"/api/v1/nodes/{path}", body, format="json")
    assert response.status_code == status
    assert says in response.json()["detail"]
    assert _node_state(live_controller) == ("idle", "")


@pytest.mark.parametrize("who", ["owner", "member", "outsider", "staff-everyday"])
def test_no_one_but_an_operator_drains(
    who: str, acme: Tenant, globex: Tenant, live_controller: Any
) -> None:
    if who == "staff-everyday":  # staff, but a token without the admin scope
        secret = _token(make_user("sam", staff=True), acme, {"read", "jobs"})
    elif who == "outsider":
        secret = _token(globex.owner, globex, {"read", "jobs"})
    else:
        secret = _token(getattr(acme, who), acme, {"read", "jobs"})
    response = _client(secret).patch(
        "/api/v1/nodes/node01", {"state": "drain", "reason": "mine"}, format="json"
    )
    assert response.status_code == 403
    assert _node_state(live_controller) == ("idle", "")


def test_billing_and_a_tenants_admin_scope_are_refused(acme: Tenant, live_controller: Any) -> None:
    """Only staff get admin-scoped tokens; a billing member's token cannot drain."""
    billing = make_user("bill")
    add_member(organization=acme.organization, user=billing, role=Membership.Role.BILLING)
    response = _client(_token(billing, acme, {"read"})).patch(
        "/api/v1/nodes/node01", {"state": "drain", "reason": "x"}, format="json"
    )
    assert response.status_code == 403


# -- scontrol -----------------------------------------------------------------------------


def _scontrol(live_server: Any, secret: str, capsys: Any, *argv: str) -> tuple[int, str, str]:
    args = scontrol.parse_args(list(argv), {})
    config = CliConfig(api_url=live_server.url, token=secret, user="olga")
    client = ApiClient(config)
    try:
        rc = scontrol.run(args, config, client)
    finally:
        client.close()
    out, err = capsys.readouterr()
    return rc, out, err


def test_scontrol_drains_and_resumes_nodes_as_slurm_does(
    live_server: Any, acme: Tenant, live_controller: Any, capsys: Any
) -> None:
    secret = _token(make_user("olga", staff=True), acme, {"read", "jobs", "admin"})
    argv = ("update", "NodeName=node01", "State=DRAIN", "Reason=bad fan")
    assert _scontrol(live_server, secret, capsys, *argv) == (0, "", "")
    assert _node_state(live_controller) == ("drain", "bad fan")
    rc, out, _ = _scontrol(live_server, secret, capsys, "show", "node", "node01")
    assert "State=DRAINED " in out, out
    assert "Reason=bad fan" in out
    resume = ("update", "nodename=node01", "state=resume")
    assert _scontrol(live_server, secret, capsys, *resume) == (0, "", "")
    assert _node_state(live_controller) == ("idle", "")

    rc, _, err = _scontrol(
        live_server, secret, capsys, "update", "NodeName=nope", "State=DRAIN", "Reason=x"
    )
    assert (rc, err) == (1, "slurm_update error: Invalid node name specified\n")


def test_scontrol_as_a_tenant_is_refused(
    live_server: Any, acme: Tenant, live_controller: Any, capsys: Any
) -> None:
    secret = _token(acme.owner, acme, {"read", "jobs"})
    rc, _, err = _scontrol(
        live_server, secret, capsys, "update", "NodeName=node01", "State=DRAIN", "Reason=x"
    )
    assert rc == 1 and err.startswith("slurm_update error: This API token lacks the 'admin'")
    assert _node_state(live_controller) == ("idle", "")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("NodeName=n1", "State=DRAIN"), "You must specify a reason when DOWNING or DRAINING"),
        (("NodeName=n1", "State=FUTURE"), "Valid states are: DRAIN RESUME UNDRAIN"),
        (("NodeName=n1", "Weight=3"), "Update of this parameter is not supported: Weight=3"),
        (("NodeName=n1",), "No changes specified"),
    ],
)
def test_scontrol_refuses_a_bad_node_update_before_asking(argv: tuple[str, ...], says: str):
    with pytest.raises(UsageError, match=says):
        scontrol.parse_args(["update", *argv], {})


def test_a_hostlist_names_several_nodes() -> None:
    args = scontrol.parse_args(["update", "NodeName=sim[01-03]", "State=UNDRAIN"], {})
    assert args.node_names == ["sim01", "sim02", "sim03"]
    assert args.node_update == {"state": "resume"}
