"""The house boundaries that the design draws (DESIGN.md §2), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("django", "spurcloud", "rest_framework", "channels", "allauth")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imported_modules(path):
            if name.split(".")[0] in forbidden:
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


def test_the_scheduler_never_imports_django_or_the_web_app():
    assert offenders("scheduler", FORBIDDEN) == []


def test_the_agents_never_import_django_or_the_web_app():
    assert offenders("agents", FORBIDDEN) == []


def test_the_scheduler_core_does_no_io_and_reads_no_clock():
    io_modules = ("socket", "subprocess", "threading", "time", "random", "os", "httpx", "asyncio")
    assert offenders("scheduler/core", io_modules) == []


def test_the_web_app_reaches_the_controller_only_through_its_client():
    assert [o for o in offenders("spurcloud", ("scheduler",)) if "scheduler.ctld" in o] == []


def test_the_checker_sees_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from django.db import models\nimport spurcloud.settings\n")
    assert imported_modules(bad) == {"django.db", "spurcloud.settings"}
