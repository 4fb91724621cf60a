"""`seed_demo` and the `spurcloud` command line."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from spurcloud import cli
from spurcloud.tenants.models import ApiToken, Membership


def _seed(monkeypatch: pytest.MonkeyPatch, password: str | None = None) -> dict[str, Any]:
    if password is None:
        monkeypatch.delenv("SPUR_ADMIN_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("SPUR_ADMIN_PASSWORD", password)
    out = StringIO()
    call_command("seed_demo", stdout=out)
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1
    return dict(json.loads(lines[0]))


def test_seed_demo_prints_credentials_that_work(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = _seed(monkeypatch)
    assert set(creds) == {"email", "password", "token", "organization"}
    assert creds["organization"] == "demo"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {creds['token']}")
    assert client.get("/api/v1/jobs").status_code == 200
    assert client.login(username="admin", password=creds["password"])
    # The CLI's token reads and submits; operator powers are for tokens made on purpose.
    assert ApiToken.objects.get(revoked_at__isnull=True).scopes == "read jobs"


def test_seed_demo_run_twice_reuses_everything_and_replaces_its_token(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _seed(monkeypatch)
    second = _seed(monkeypatch, password="chosen-password-1")
    assert second["password"] == "chosen-password-1"
    assert Membership.objects.filter(organization__slug="demo", role="owner").count() == 1
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 1
    old = APIClient()
    old.credentials(HTTP_AUTHORIZATION=f"Bearer {first['token']}")
    assert old.get("/api/v1/jobs").status_code == 401


def test_the_cli_names_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "spurcloud web" in capsys.readouterr().out
    assert cli.main(["bogus"]) == 2


def test_the_cli_passes_management_commands_through(
    db: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["manage", "check"]) == 0
    assert "no issues" in capsys.readouterr().out


def test_several_web_processes_are_refused_without_a_cache_they_share(
    settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert cli.main(["web", "--workers", "2"]) == 2
    assert "need a cache they share" in capsys.readouterr().err
