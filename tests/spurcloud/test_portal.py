"""The portal's pages: sign-in, the jobs dashboard, API tokens, nodes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from spurcloud.jobs.services import record_job_event
from spurcloud.portal.selection import SESSION_KEY
from spurcloud.tenants.models import ApiToken, Organization
from spurcloud.tenants.services import create_api_token
from tests.fixtures.processes import free_port
from tests.spurcloud.conftest import Tenant, event, job_dict, make_user


def _browser(user: Any) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def test_the_sign_in_page_asks_for_an_email(db: None) -> None:
    response = Client().get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="login"' in response.content
    assert b'type="email"' in response.content


def test_signing_in_with_email_and_password_reaches_the_dashboard(acme: Tenant) -> None:
    browser = Client()
    response = browser.post(
        "/accounts/login/",
        {"login": "max@example.com", "password": "correct horse battery"},
        follow=True,
    )
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == "/"
    assert b"Active jobs of Acme" in response.content


def test_pages_need_a_signed_in_user(db: None) -> None:
    for path in ("/", "/tokens/", "/nodes/"):
        response = Client().get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_someone_without_an_organisation_is_asked_to_create_one(db: None) -> None:
    browser = _browser(make_user("newbie"))
    assert browser.get("/")["Location"] == "/organizations/new"
    response = browser.post("/organizations/new", {"name": "New Lab"})
    assert response["Location"] == "/"
    assert Organization.objects.get(slug="new-lab").memberships.get().role == "owner"
    assert b"Active jobs of New Lab" in browser.get("/").content


@pytest.mark.parametrize("who", ["owner", "member"])
def test_the_dashboard_lists_the_organisations_jobs_only(
    who: str, acme: Tenant, globex: Tenant
) -> None:
    record_job_event(event=event(job_dict(41, tenant="acme", user="max", name="acme-train")))
    record_job_event(event=event(job_dict(42, tenant="globex", user="oscar", name="gx-train")))
    content = _browser(getattr(acme, who)).get("/").content
    assert b"acme-train" in content
    assert b"gx-train" not in content
    assert b'data-job-id="41"' in content
    assert b"jobs-live.js" in content


def test_an_outsider_cannot_select_the_organisation(acme: Tenant, globex: Tenant) -> None:
    browser = _browser(globex.owner)
    response = browser.post("/organizations/select", {"organization": acme.organization.pk})
    assert response.status_code == 404
    assert browser.session.get(SESSION_KEY) != acme.organization.pk


def test_a_member_of_two_organisations_switches_between_them(acme: Tenant, globex: Tenant) -> None:
    from spurcloud.tenants.services import add_member

    add_member(organization=globex.organization, user=acme.member)
    browser = _browser(acme.member)
    browser.post("/organizations/select", {"organization": globex.organization.pk})
    assert b"Active jobs of Globex" in browser.get("/").content
    response = browser.post(
        "/organizations/select", {"organization": acme.organization.pk, "next": "https://evil/"}
    )
    assert response["Location"] == "/"  # never off-site


@pytest.mark.parametrize("who", ["owner", "member"])
def test_a_new_token_is_shown_once(who: str, acme: Tenant) -> None:
    user = getattr(acme, who)
    browser = _browser(user)
    response = browser.post(
        "/tokens/", {"name": "laptop", "scopes": ["read", "jobs"], "expires_in_days": "90"}
    )
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(user=user, name="laptop")
    secret = response.context["new_secret"]
    assert secret.startswith(token.prefix)
    assert secret.encode() in response.content
    again = browser.get("/tokens/")
    assert secret.encode() not in again.content
    assert token.prefix.encode() in again.content


def test_a_member_revokes_their_token(acme: Tenant) -> None:
    token, _ = create_api_token(user=acme.member, organization=acme.organization, name="x")
    response = _browser(acme.member).post(f"/tokens/{token.pk}/revoke")
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_nobody_revokes_someone_elses_token(acme: Tenant, globex: Tenant) -> None:
    token, _ = create_api_token(user=acme.member, organization=acme.organization, name="x")
    for user in (acme.owner, globex.owner):
        assert _browser(user).post(f"/tokens/{token.pk}/revoke").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


@pytest.mark.parametrize("who", ["owner", "member"])
def test_the_nodes_page_shows_tenants_the_nodes_but_not_how_to_reach_them(
    who: str, acme: Tenant, live_controller: Any
) -> None:
    response = _browser(getattr(acme, who)).get("/nodes/")
    assert response.status_code == 200
    assert b"node01" in response.content
    assert b"h100\xc3\x971" in response.content  # its GPU models
    assert b"127.0.0.1:9" not in response.content  # its agent's URL
    assert b"GPUs in use" not in response.content


def test_the_nodes_page_shows_an_outsider_the_same_cluster(
    globex: Tenant, live_controller: Any
) -> None:
    response = _browser(globex.member).get("/nodes/")
    assert b"node01" in response.content and b"127.0.0.1:9" not in response.content


def test_the_nodes_page_shows_staff_everything(acme: Tenant, live_controller: Any) -> None:
    from spurcloud.tenants.services import add_member

    staff = make_user("root", staff=True)
    add_member(organization=acme.organization, user=staff)
    response = _browser(staff).get("/nodes/")
    assert b"http://127.0.0.1:9" in response.content
    assert b"GPUs in use" in response.content


def test_the_nodes_page_says_when_the_controller_is_unreachable(
    acme: Tenant, settings: Any
) -> None:
    settings.SPUR_CONTROLLER_URLS = [f"http://127.0.0.1:{free_port()}"]
    response = _browser(acme.member).get("/nodes/")
    assert response.status_code == 200
    assert b"The scheduler is unreachable" in response.content


def test_the_admin_lists_jobs_tokens_and_organisations(acme: Tenant) -> None:
    admin = make_user("root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    record_job_event(event=event(job_dict(5, tenant="acme", user="max")))
    browser = _browser(admin)
    for path in ("jobs/jobrecord", "tenants/organization", "tenants/membership",
                 "tenants/apitoken", "tenants/auditevent"):  # fmt: skip
        assert browser.get(f"/admin/{path}/").status_code == 200, path


def test_static_files_are_served_without_collectstatic(db: None) -> None:
    from django.contrib.staticfiles import finders

    assert finders.find("css/spur.css")
    assert finders.find("js/jobs-live.js")


def test_a_job_shows_its_exit_as_sacct_does_and_no_reason_when_there_is_none(
    acme: Tenant,
) -> None:
    record_job_event(
        event=event(
            job_dict(
                43, tenant="acme", user="max", state="FAILED", exit_code=0, signal=15, reason="None"
            )
        )
    )
    record_job_event(event=event(job_dict(44, tenant="acme", user="max", state="PREEMPTED")))
    page = _browser(acme.member).get("/jobs/").content.decode()
    row = page[page.index('data-job-id="43"') :].split("</tr>")[0]
    assert '<td data-field="exit">0:15</td>' in row  # as sacct's ExitCode, not "0"
    assert '<td data-field="reason"></td>' in row
    assert 'class="state state-failed">FAILED<' in row
    preempted = page[page.index('data-job-id="44"') :].split("</tr>")[0]
    assert 'class="state state-stopped">PREEMPTED<' in preempted
    assert " UTC</td>" in row
