"""The agent never imports Django or the web app (DESIGN.md, "Packages and their boundaries")."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = ("django", "spurcloud", "rest_framework", "celery")
ROOT = Path(__file__).resolve().parents[2]


def test_no_agent_module_imports_django_or_spurcloud() -> None:
    offenders = []
    for path in sorted((ROOT / "agents").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
