"""Security headers: a Content-Security-Policy that every page passes (no inline script,
style or event handler anywhere: the portal, allauth's pages, the admin, the Swagger
UI), X-Frame-Options DENY, and HSTS with Secure cookies in production only."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from spurcloud.headers import CONTENT_SECURITY_POLICY
from tests.fixtures.processes import free_port
from tests.spurcloud.conftest import Tenant, make_user
from tests.spurcloud.test_settings import _load_settings


class InlineCode(HTMLParser):
    """What a page holds that a strict CSP would block: <script> without src (other than
    JSON data), <style>, style="" and on*="" attributes; and where its scripts and
    stylesheets come from."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked: list[str] = []
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            if a.get("src"):
                self.sources.append(a["src"] or "")
            elif a.get("type") != "application/json":
                self.blocked.append("inline <script>")
        if tag == "style":
            self.blocked.append("<style>")
        if tag == "link" and a.get("rel") == "stylesheet":
            self.sources.append(a.get("href") or "")
        for name, _ in attrs:
            if name == "style" or name.startswith("on"):
                self.blocked.append(f"<{tag} {name}=...>")


def _check_page(response: Any) -> InlineCode:
    assert response.status_code == 200, response
    assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert response["X-Frame-Options"] == "DENY"
    page = InlineCode()
    page.feed(response.content.decode())
    assert page.blocked == [], page.blocked
    # Every script and stylesheet is this site's own (no CDN: 'self' only).
    assert all(src.startswith("/") and not src.startswith("//") for src in page.sources)
    return page


def test_the_policy_allows_nothing_inline_and_nothing_from_elsewhere() -> None:
    policy = dict(part.split(" ", 1) for part in CONTENT_SECURITY_POLICY.split("; "))
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["object-src"] == "'none'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY


@pytest.mark.parametrize("who", ["owner", "member"])
def test_the_portals_pages_pass_the_policy(who: str, acme: Tenant, settings: Any) -> None:
    settings.SPUR_CONTROLLER_URLS = [f"http://127.0.0.1:{free_port()}"]  # nodes: unreachable
    browser = Client()
    browser.force_login(getattr(acme, who))
    for path in ("/", "/tokens/", "/nodes/", "/organizations/new"):
        _check_page(browser.get(path))
    created = browser.post("/tokens/", {"name": "t", "scopes": ["read"], "expires_in_days": ""})
    _check_page(created)


def test_the_organisation_switch_works_without_inline_script(acme: Tenant, globex: Tenant) -> None:
    from spurcloud.tenants.services import add_member

    add_member(organization=globex.organization, user=acme.member)
    browser = Client()
    browser.force_login(acme.member)
    page = _check_page(browser.get("/"))
    assert "/static/js/portal.js" in page.sources
    assert b"data-submit-on-change" in browser.get("/").content
    script = Path(str(finders.find("js/portal.js"))).read_text()
    assert "select[data-submit-on-change]" in script


def test_the_owners_invitations_page_passes_the_policy(acme: Tenant) -> None:
    browser = Client()
    browser.force_login(acme.owner)
    _check_page(browser.get("/invitations/"))


def test_the_sign_in_and_sign_up_pages_pass_the_policy(db: None) -> None:
    for path in ("/accounts/login/", "/accounts/signup/", "/accounts/password/reset/"):
        _check_page(Client().get(path))


def test_the_admin_passes_the_policy(db: None) -> None:
    _check_page(Client().get("/admin/login/"))
    browser = Client()
    browser.force_login(make_user("root", staff=True))
    _check_page(browser.get("/admin/"))


def test_the_swagger_ui_passes_the_policy(db: None) -> None:
    page = _check_page(Client().get("/api/docs/"))
    scripts = [src for src in page.sources if not src.endswith(".css")]
    assert any("swagger-ui-bundle.js" in src for src in scripts)
    assert any(src == "/static/css/swagger-page.css" for src in page.sources)
    for src in page.sources:
        response = Client().get(src)
        assert response.status_code == 200, src
        if "script" in src:  # the start-up script, served apart for the policy's sake
            assert response["Content-Type"].startswith("application/javascript")
            assert b"SwaggerUIBundle(" in response.content
            assert b'"validatorUrl": null' in response.content  # no badge fetched off-site
        if hasattr(response, "close"):
            response.close()


def test_api_answers_carry_the_policy_too(db: None) -> None:
    response = Client().get("/api/v1/jobs")
    assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert response["X-Content-Type-Options"] == "nosniff"


def test_over_https_in_production_the_answer_asks_for_https_only(db: None, settings: Any) -> None:
    settings.SECURE_HSTS_SECONDS = 31536000
    response = Client().get("/accounts/login/", secure=True)
    assert response["Strict-Transport-Security"] == "max-age=31536000"


def _security(env: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    code = (
        "import json; from django.conf import settings as s; print(json.dumps({"
        "'hsts': s.SECURE_HSTS_SECONDS, 'secure': s.SESSION_COOKIE_SECURE, "
        "'csrf_secure': s.CSRF_COOKIE_SECURE, 'frames': s.X_FRAME_OPTIONS}))"
    )
    result = _load_settings(env, tmp_path, code=code)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_production_sends_hsts_and_marks_cookies_secure(tmp_path: Path) -> None:
    production = {"DEBUG": "false", "SECRET_KEY": "s", "SPUR_CLUSTER_TOKEN": "t"}
    loaded = _security(production, tmp_path)
    assert loaded == {"hsts": 31536000, "secure": True, "csrf_secure": True, "frames": "DENY"}


def test_the_embedded_platform_over_plain_http_sends_neither(tmp_path: Path) -> None:
    # What spurcloud/stack.py sets: production settings, plain HTTP on the machine.
    embedded = {
        "DEBUG": "false",
        "SECRET_KEY": "s",
        "SPUR_CLUSTER_TOKEN": "t",
        "SECURE_COOKIES": "false",
    }
    loaded = _security(embedded, tmp_path)
    assert loaded == {"hsts": 0, "secure": False, "csrf_secure": False, "frames": "DENY"}
