"""Every portal page, API route and slurmrestd route, as each of the organisation's roles
(owner, admin, member, billing), an outsider (another organisation's owner) and nobody
signed in: one table of what each gets, each request made for real (a real controller,
the organisation's data: a job, a session, a membership, an SSH key, a token of another
member, an invitation, an invoice with a credit note, a spend alert).

The routes are read from Django's URL resolver, so a new route without a row here fails
`test_every_route_has_a_row` (the admin's and allauth's are theirs, tested there).

Outcomes: a status code; for a portal form's POST, which answers with a redirect, DONE
or REFUSED (the message it leaves: success or error); LOGIN, the redirect to sign-in.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from spurcloud.billing.invoices import issue_credit_note, issue_invoice
from spurcloud.billing.models import Invoice, MeteredRun, QosClass, SpendAlert, UsageRecord
from spurcloud.billing.spend_alerts import create_spend_alert
from spurcloud.jobs.services import submit_job
from spurcloud.tenants.models import Membership
from spurcloud.tenants.services import (
    add_member,
    add_ssh_key,
    create_api_token,
    create_invitation,
)
from tests.fixtures.controller import RunningController, write_controller_config
from tests.fixtures.processes import Processes, free_port
from tests.fixtures.stripe_fake import FakeStripe, stripe_fake  # noqa: F401 - a fixture
from tests.spurcloud.conftest import Tenant, make_user

WHO = ("owner", "admin", "member", "billing", "outsider", "anonymous")
DONE, REFUSED, LOGIN = "done", "refused", "login"
SLURM = "/slurm/v0.0.40"
SESSION_SPEC = {"qos": "interactive", "comment": "spur-session:shell"}


@dataclass(frozen=True)
class Row:
    """One request, and what each of WHO gets (in WHO's order)."""

    name: str  # the route's name (namespace:name), or its pattern when it has none
    method: str
    path: str  # with {job}, {session}, {membership}, ... from `Targets`
    expect: tuple[Any, Any, Any, Any, Any, Any]
    data: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"


def everyone(outcome: Any, anonymous: Any = LOGIN) -> tuple[Any, ...]:
    return (outcome,) * 5 + (anonymous,)


def org(outcome: Any, *, outsider: Any = 404, anonymous: Any = LOGIN) -> tuple[Any, ...]:
    """The organisation's roles alike; the outsider gets the same 404 as for nothing."""
    return (outcome,) * 4 + (outsider, anonymous)


def api(outcome: Any, outsider: Any = None) -> tuple[Any, ...]:
    return (outcome,) * 4 + (outcome if outsider is None else outsider, 401)


def launch_data(prefix: str = "") -> dict[str, str]:
    return {f"{prefix}idempotency_key": uuid.uuid4().hex}


PORTAL_ACTIONS = {
    # A held job of another member: owners and admins act on it, a member only on their
    # own, billing on none; it does not run (nothing to requeue), and suspend and resume
    # are the cluster operators'.
    "cancel": (DONE, DONE, REFUSED, REFUSED, 404, LOGIN),
    "hold": (DONE, DONE, REFUSED, REFUSED, 404, LOGIN),
    "release": (DONE, DONE, REFUSED, REFUSED, 404, LOGIN),
    "requeue": (REFUSED, REFUSED, REFUSED, REFUSED, 404, LOGIN),
    "requeuehold": (REFUSED, REFUSED, REFUSED, REFUSED, 404, LOGIN),
    "suspend": (REFUSED, REFUSED, REFUSED, REFUSED, 404, LOGIN),
    "resume": (REFUSED, REFUSED, REFUSED, REFUSED, 404, LOGIN),
}
API_ACTIONS = {
    "cancel": (200, 200, 403, 403, 404, 401),
    "hold": (200, 200, 403, 403, 404, 401),
    "release": (200, 200, 403, 403, 404, 401),
    "requeue": (409, 409, 403, 403, 404, 401),
    "requeuehold": (409, 409, 403, 403, 404, 401),
    "suspend": (403, 403, 403, 403, 404, 401),
    "resume": (403, 403, 403, 403, 404, 401),
}
READERS = (200, 200, 403, 200)  # billing's reads: owners, admins, billing members

PORTAL = [
    Row("portal:dashboard", "GET", "/", everyone(200)),
    Row("portal:jobs", "GET", "/jobs/", everyone(200)),
    Row("portal:job-detail", "GET", "/jobs/{job}/", org(200)),
    *(
        Row(f"portal:job-{action}", "POST", f"/jobs/{{job}}/{action}", expect)
        for action, expect in PORTAL_ACTIONS.items()
    ),
    # Its output: none while it has not started, the same 404 as the outsider's.
    Row("portal:job-stdout", "GET", "/jobs/{job}/stdout", org(404)),
    Row("portal:job-stderr", "GET", "/jobs/{job}/stderr", org(404)),
    Row("portal:launch", "GET", "/launch/", everyone(200)),
    # Billing runs nothing: the form again, with why; the outsider launches in their own.
    Row(
        "portal:launch",
        "POST",
        "/launch/",
        (DONE, DONE, DONE, 200, DONE, LOGIN),
        data={"command": "true", "time_limit_min": "5"},
    ),
    Row(
        "portal:session-launch",
        "POST",
        "/sessions/launch",
        (302, 302, 302, 200, 302, LOGIN),
        data={"session-template": "shell", "session-max_minutes": "30"},
    ),
    Row("portal:session-detail", "GET", "/sessions/{session}/", org(200)),
    Row(
        "portal:session-status",
        "GET",
        "/sessions/{session}/status",
        org(200, anonymous=204),  # to htmx, the sign-in is an HX-Redirect
        headers={"HX-Request": "true"},
    ),
    Row("portal:session-stop", "POST", "/sessions/{session}/stop", PORTAL_ACTIONS["cancel"]),
    # Its JupyterLab is for the session's own user alone (and it has none: a shell).
    Row("portal:session-jupyter", "GET", "/sessions/{session}/jupyter/lab", org(403)),
    Row("portal:account", "GET", "/account/", everyone(200)),
    Row("portal:ssh-key-remove", "POST", "/account/ssh-keys/{key}/remove", everyone(404)),
    Row("portal:tokens", "GET", "/tokens/", everyone(200)),
    Row("portal:token-revoke", "POST", "/tokens/{token}/revoke", everyone(404)),
    Row("portal:nodes", "GET", "/nodes/", everyone(200)),
    Row("portal:operator-nodes", "GET", "/operator/nodes/", everyone(403)),
    Row(
        "portal:operator-node-drain",
        "POST",
        "/operator/nodes/node01/drain",
        everyone(403),
        data={"reason": "x"},
    ),
    Row("portal:operator-node-resume", "POST", "/operator/nodes/node01/resume", everyone(403)),
    Row("portal:operator-queue", "GET", "/operator/queue/", everyone(403)),
    Row("portal:billing", "GET", "/billing/", everyone(200)),
    # Owners and billing members pay (the Checkout link's page); the outsider their own.
    Row(
        "portal:billing-topup",
        "POST",
        "/billing/topup",
        (200, 403, 403, 200, 200, LOGIN),
        data={"amount": "25"},
    ),
    # Stripe's customer portal: the same people as a top-up (the link's page).
    Row(
        "portal:billing-stripe-portal",
        "POST",
        "/billing/stripe-portal",
        (200, 403, 403, 200, 200, LOGIN),
    ),  # fmt: skip
    Row(
        "portal:billing-alert-add",
        "POST",
        "/billing/alerts",
        (DONE, REFUSED, REFUSED, DONE, DONE, LOGIN),
        data={"kind": "balance_below", "threshold": "{unique}"},
    ),
    Row(
        "portal:billing-alert-delete",
        "POST",
        "/billing/alerts/{alert}/delete",
        (DONE, REFUSED, REFUSED, DONE, 404, LOGIN),
    ),
    Row("portal:billing-invoice", "GET", "/billing/invoices/{invoice}", (*READERS, 404, LOGIN)),
    Row(
        "portal:billing-invoice-pdf",
        "GET",
        "/billing/invoices/{invoice}.pdf",
        (*READERS, 404, LOGIN),
    ),
    Row(
        "portal:billing-credit-note-pdf",
        "GET",
        "/billing/invoices/{invoice}/credit-notes/{note}.pdf",
        (*READERS, 404, LOGIN),
    ),
    Row("portal:revenue", "GET", "/revenue/", everyone(403)),
    Row("portal:revenue-csv", "GET", "/revenue.csv", everyone(403)),
    # The outsider owns another organisation: they invite to theirs.
    Row("portal:invitations", "GET", "/invitations/", (200, 200, 403, 403, 200, LOGIN)),
    Row(
        "portal:invitations",
        "POST",
        "/invitations/",
        (200, 200, 403, 403, 200, LOGIN),
        data={"email": "new{unique}@example.org", "role": "member"},
    ),
    # The link carries the invitation to the join page, or (nobody signed in) to sign-up.
    Row("portal:invitation-accept", "GET", "/invitations/accept/{secret}", everyone(302, 302)),
    Row("portal:invitation-join", "GET", "/invitations/join", everyone(404)),
    Row("portal:organization", "GET", "/organization/", everyone(200)),
    Row(
        "portal:member-remove",
        "POST",
        "/organization/members/{membership}/remove",
        PORTAL_ACTIONS["cancel"],
    ),
    Row(
        "portal:member-role",
        "POST",
        "/organization/members/{membership}/role",
        PORTAL_ACTIONS["cancel"],
        data={"role": "billing"},
    ),
    Row("portal:organization-create", "GET", "/organizations/new", everyone(200)),
    Row(
        "portal:organization-select",
        "POST",
        "/organizations/select",
        org(302),  # another's organisation: the same 404 as a missing one
        data={"organization": "{organization}"},
    ),
    Row("favicon.ico", "GET", "/favicon.ico", everyone(301, 301)),
]

API = [
    Row("api:jobs", "GET", "/api/v1/jobs", api(200)),
    Row(
        "api:jobs",
        "POST",
        "/api/v1/jobs",
        (201, 201, 201, 403, 201, 401),
        {"script": "#!/bin/sh\ntrue\n"},
    ),
    Row("api:job-detail", "GET", "/api/v1/jobs/{job}", api(200, 404)),
    # Not started: no output yet, the same 404 as the outsider's.
    Row("api:job-output", "GET", "/api/v1/jobs/{job}/output", api(404)),
    *(
        Row(f"api:job-{action}", "POST", f"/api/v1/jobs/{{job}}/{action}", expect)
        for action, expect in API_ACTIONS.items()
    ),
    # Steps run in a running job, the job's own user's or (owners, admins) anyone's.
    Row(
        "api:job-steps",
        "POST",
        "/api/v1/jobs/{job}/steps",
        (409, 409, 403, 403, 404, 401),
        {"argv": ["true"]},
    ),
    Row(
        "api:job-step-cancel",
        "POST",
        "/api/v1/jobs/{job}/steps/0/cancel",
        (404, 404, 403, 403, 404, 401),  # it has no step 0
    ),
    # One node of a running step, carried to its agent: the job runs on none (404).
    *(
        Row(
            f"api:job-step-{name}",
            "POST",
            f"/api/v1/jobs/{{job}}/steps/0/{name}",
            (404, 404, 403, 403, 404, 401),
            {"node": "node01", "io": "spur-stepio.x", **data},
        )
        for name, data in (
            ("attach", {}),
            ("input", {"offset": 0, "data": "eA=="}),
            ("resize", {"cols": 80, "rows": 24}),
            ("signal", {"signal": 2}),
        )
    ),  # fmt: skip
    Row(
        "api:job-step-end",
        "POST",
        "/api/v1/jobs/{job}/steps/0/end",
        (404, 404, 403, 403, 404, 401),  # it has no step 0
        {"exit_code": 0},
    ),
    Row("api:queue", "GET", "/api/v1/queue", api(200)),
    Row("api:nodes", "GET", "/api/v1/nodes", api(200)),
    # Operators' (a staff user's admin-scoped token): no tenant's token may.
    Row(
        "api:node-update",
        "PATCH",
        "/api/v1/nodes/node01",
        api(403),
        {"state": "DRAIN", "reason": "x"},
    ),
    Row("api:partitions", "GET", "/api/v1/partitions", api(200)),
    Row("api:queue-detail", "GET", "/api/v1/queue/{job}", api(200, 404)),
    *(
        Row(f"api:{name}", "GET", f"/api/v1/{name}", api(200))
        for name in ("ping", "config", "priorities", "shares", "associations", "qos", "topology")
    ),
    Row("api:billing-balance", "GET", "/api/v1/billing/balance", api(200)),
    Row("api:billing-prices", "GET", "/api/v1/billing/prices", api(200)),
    Row("api:billing-ledger", "GET", "/api/v1/billing/ledger", (*READERS, 200, 401)),
    Row("api:billing-usage", "GET", "/api/v1/billing/usage", (*READERS, 200, 401)),
    Row(
        "api:billing-topups",
        "POST",
        "/api/v1/billing/topups",
        (201, 403, 403, 201, 201, 401),
        {"amount_cents": 2500},
    ),
    Row("api:billing-portal", "POST", "/api/v1/billing/portal", (201, 403, 403, 201, 201, 401)),
    Row("api:billing-invoices", "GET", "/api/v1/billing/invoices", (*READERS, 200, 401)),
    Row("api:billing-invoice", "GET", "/api/v1/billing/invoices/{invoice}", (*READERS, 404, 401)),
    Row(
        "api:billing-invoice-html",
        "GET",
        "/api/v1/billing/invoices/{invoice}/html",
        (*READERS, 404, 401),
    ),
    Row(
        "api:billing-invoice-pdf",
        "GET",
        "/api/v1/billing/invoices/{invoice}/pdf",
        (*READERS, 404, 401),
    ),
    Row(
        "api:billing-credit-note-pdf",
        "GET",
        "/api/v1/billing/invoices/{invoice}/credit-notes/{note}/pdf",
        (*READERS, 404, 401),
    ),
    Row("api:schema", "GET", "/api/schema/", everyone(200, 200)),
    Row("api:docs", "GET", "/api/docs/", everyone(200, 200)),
    Row("api:not-found", "GET", "/api/v1/nothing-here", everyone(404, 404)),
]

SLURMRESTD = [
    *(
        Row(f"slurmrestd:{name}", "GET", f"{SLURM}/{path}", api(200))
        for name, path in (
            ("ping", "ping"),
            ("diag", "diag"),
            ("jobs", "jobs"),
            ("nodes", "nodes"),
            ("node", "node/node01"),
            ("partitions", "partitions"),
            ("partition", "partition/gpu"),
        )
    ),
    Row(
        "slurmrestd:job-submit",
        "POST",
        f"{SLURM}/job/submit",
        (200, 200, 200, 403, 200, 401),
        {"job": {"script": "#!/bin/sh\ntrue\n"}},
    ),
    Row("slurmrestd:job", "GET", f"{SLURM}/job/{{job}}", api(200, 404)),
    # scancel through slurmrestd: the API's rules.
    Row("slurmrestd:job", "DELETE", f"{SLURM}/job/{{job}}", API_ACTIONS["cancel"]),
    Row("slurmrestd:not-found-version", "GET", f"{SLURM}/nothing", everyone(404, 404)),
    Row("slurmrestd:not-found", "GET", "/slurm/nothing", everyone(404, 404)),
]

SITE = [
    Row("healthz", "GET", "/healthz", everyone(200, 200)),
    # Stripe's calls carry its signature; nobody else's is one.
    Row("stripe-webhook", "POST", "/billing/stripe/webhook", everyone(400, 400)),
]

ROWS = [*PORTAL, *API, *SLURMRESTD, *SITE]


# -- the routes, from the resolver ------------------------------------------------------


def _route_names(patterns: list[Any], namespace: str = "") -> Iterator[str]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace in ("admin",) or entry.urlconf_name == "allauth.urls":
                continue
            if getattr(entry.urlconf_module, "__name__", "") == "allauth.urls":
                continue
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _route_names(entry.url_patterns, inner)
        elif isinstance(entry, URLPattern):
            if namespace == "" and entry.name == "admin-login":
                continue  # the admin's sign-in (spurcloud/admin_login.py): the admin's tests
            yield f"{namespace}{entry.name}" if entry.name else str(entry.pattern)


def test_every_route_has_a_row_and_every_row_a_route() -> None:
    routes = set(_route_names(get_resolver().url_patterns))
    rows = {row.name for row in ROWS}
    assert routes - rows == set(), "routes without a row in the role matrix"
    assert rows - routes == set(), "rows for routes that do not exist"


# -- the organisation and its data ------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningController]:
    """One controller for the whole table (a process a request would take too long to
    start), with one node that never times out: each test's jobs are its own."""
    root = tmp_path_factory.mktemp("matrix-controller")
    token = uuid.uuid4().hex
    port, raft = free_port(), free_port()
    config = root / "spur.toml"
    write_controller_config(
        config,
        token=token,
        http_port=port,
        raft_port=raft,
        state_dir=root / "ctld",
        broker_url="filesystem://",
        broker_folder=root / "broker",
        node_timeout_s=86400.0,
    )
    procs = Processes(root / "logs")
    running = RunningController(f"http://127.0.0.1:{port}", token, config, root / "ctld", procs)
    try:
        running.start()
        client = running.client()
        try:
            client.register_node(
                {
                    "name": "node01",
                    "cpus": 64,
                    "memory_mb": 256000,
                    "agent_url": "http://127.0.0.1:9",
                    "gpus": [
                        {"index": i, "vendor": "nvidia", "model": "h100", "memory_mb": 81920}
                        for i in range(8)
                    ],
                }
            )
        finally:
            client.close()
        yield running
    finally:
        procs.stop_all()


@dataclass
class Targets:
    """What the requests act on: another member's (mo's) job, session, membership, SSH
    key and token; the organisation's invitation, invoice, credit note and spend alert."""

    values: dict[str, Any]

    def fill(self, text: str) -> str:
        return text.format(**self.values)


def _openssh_line() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def _invoice_with_usage(tenant: Tenant) -> Any:
    month = datetime(2026, 3, 1, tzinfo=UTC)
    run = MeteredRun.objects.create(
        organization=tenant.organization,
        cluster="c",
        job_id=1,
        attempt=0,
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        gpu_milli=1000,
        started_at=month,
        metered_until=month,
    )
    UsageRecord.objects.create(
        run=run,
        organization=tenant.organization,
        period_start=month + timedelta(days=1),
        period_end=month + timedelta(days=1, minutes=1),
        gpu_model="h100",
        qos_class=QosClass.ON_DEMAND,
        gpu_milli_seconds=60_000,
        amount_micro=5_000_000,
    )
    return issue_invoice(organization=tenant.organization, month=month)


@pytest.fixture
def people(acme: Tenant, globex: Tenant) -> dict[str, Any]:
    admin, billing = make_user("ada"), make_user("bill")
    add_member(organization=acme.organization, user=admin, role="admin", by=acme.owner)
    add_member(organization=acme.organization, user=billing, role="billing", by=acme.owner)
    return {
        "owner": acme.owner,
        "admin": admin,
        "member": acme.member,
        "billing": billing,
        "outsider": globex.owner,
        "anonymous": None,
    }


_unique = itertools.count(100)


def _targets(acme: Tenant) -> Targets:
    """A fresh set for each request: what one role's request changes, the next never sees."""
    mo = make_user(f"mo{uuid.uuid4().hex[:8]}")
    membership = add_member(organization=acme.organization, user=mo, by=acme.owner)
    job = submit_job(
        organization=acme.organization,
        user=mo,
        spec={"script": "#!/bin/sh\ntrue\n", "hold": True, "name": "mos"},
    )
    session = submit_job(
        organization=acme.organization,
        user=mo,
        spec={"script": "#!/bin/sh\nsleep 60\n", "hold": True, **SESSION_SPEC},
    )
    key = add_ssh_key(user=mo, name="mo", public_key=_openssh_line())
    token, _ = create_api_token(user=mo, organization=acme.organization, name="mo")
    _, secret = create_invitation(
        organization=acme.organization, email=f"{uuid.uuid4().hex[:8]}@example.org", by=acme.owner
    )
    invoice = Invoice.objects.filter(organization=acme.organization).first()
    invoice = invoice or _invoice_with_usage(acme)
    note = invoice.credit_notes.first() or issue_credit_note(
        invoice=invoice, amount_micro=1_000_000, reason="outage"
    )
    alert = create_spend_alert(
        organization=acme.organization,
        user=acme.owner,
        kind="balance_below",
        threshold_micro=10_000_000 + SpendAlert.objects.count(),
    )
    return Targets(
        {
            "job": job["job_id"],
            "session": session["job_id"],
            "membership": membership.pk,
            "key": key.pk,
            "token": token.pk,
            "secret": secret,
            "invoice": invoice.pk,
            "note": note.pk,
            "alert": alert.pk,
            "organization": acme.organization.pk,
            "unique": next(_unique),
        }
    )


def _portal_outcome(response: Any) -> Any:
    if response.status_code in (301, 302):
        if response["Location"].startswith("/accounts/login/"):
            return LOGIN
        levels = {m.level_tag for m in get_messages(response.wsgi_request)}
        if "error" in levels:
            return REFUSED
        if "success" in levels:
            return DONE
    return response.status_code


def _request(who: str, user: Any, row: Row, targets: Targets, acme: Tenant) -> Any:
    path = targets.fill(row.path)
    data = {k: targets.fill(v) if isinstance(v, str) else v for k, v in row.data.items()}
    if not path.startswith(("/api/", "/slurm/")):  # the portal's, and the site's own
        client = Client()
        if user is not None:
            client.force_login(user)
        if row.method == "POST" and row.name in ("portal:launch", "portal:session-launch"):
            data = {**data, **launch_data("session-" if "session" in row.name else "")}
        response = getattr(client, row.method.lower())(path, data, headers=row.headers)
        return _portal_outcome(response)
    api_client = APIClient()
    if user is not None:
        organization = Membership.objects.filter(user=user).first().organization  # type: ignore[union-attr]
        _, secret = create_api_token(user=user, organization=organization, name=who)
        api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = getattr(api_client, row.method.lower())(path, data or None, format="json")
    return response.status_code


@pytest.fixture
def site(cluster: RunningController, settings: Any, stripe_fake: FakeStripe) -> None:  # noqa: F811
    settings.SPUR_CONTROLLER_URLS = [cluster.url]
    settings.SPUR_CLUSTER_TOKEN = cluster.token
    settings.SPUR_CONTROLLER_RETRY_S = 0.2


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_each_role_gets_what_the_table_says(
    row: Row, site: None, acme: Tenant, people: dict[str, Any]
) -> None:
    got = {}
    for who in WHO:
        got[who] = _request(who, people[who], row, _targets(acme), acme)
    assert got == dict(zip(WHO, row.expect, strict=True)), " ".join(map(str, got.values()))
