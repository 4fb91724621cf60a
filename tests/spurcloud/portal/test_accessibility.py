"""Usable on a phone and readable by everyone: WCAG AA contrast (4.5:1) for the state
badges and the text colours, computed from the stylesheet itself; no page wider than a
390 px screen (tables scroll in their own box, long output wraps); a favicon."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from scheduler.core.contract import StateKind

ROOT = Path(__file__).resolve().parents[3]
CSS = (ROOT / "static" / "css" / "spur.css").read_text()
AA = 4.5


def _variables() -> dict[str, str]:
    root = re.search(r":root\s*\{([^}]*)\}", CSS)
    assert root is not None
    return dict(re.findall(r"(--[a-z-]+):\s*(#[0-9a-fA-F]{3,6})", root.group(1)))


def _rules() -> dict[str, dict[str, str]]:
    """Each selector's declarations (the innermost rules, @media ones included)."""
    variables = _variables()
    rules: dict[str, dict[str, str]] = {}
    for selectors, body in re.findall(
        r"([^{}]+)\{([^{}]*)\}", re.sub(r"/\*.*?\*/", "", CSS, flags=re.S)
    ):
        declarations = dict(re.findall(r"([a-z-]+)\s*:\s*([^;]+)", body))
        for name, value in declarations.items():
            declarations[name] = re.sub(
                r"var\((--[a-z-]+)\)", lambda m: variables[m.group(1)], value.strip()
            )
        for selector in selectors.split(","):
            rules.setdefault(selector.strip(), {}).update(declarations)
    return rules


def _luminance(colour: str) -> float:
    hex_ = colour.lstrip("#")
    if len(hex_) == 3:
        hex_ = "".join(c * 2 for c in hex_)
    channels = [int(hex_[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(foreground: str, background: str) -> float:
    lighter, darker = sorted((_luminance(foreground), _luminance(background)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def test_the_contrast_formula_is_wcags() -> None:
    assert contrast("#000", "#fff") == pytest.approx(21)
    assert contrast("#777", "#fff") == pytest.approx(4.48, abs=0.01)


@pytest.mark.parametrize("kind", [k.value for k in StateKind])
def test_every_state_badge_reaches_aa_contrast(kind: str) -> None:
    rule = _rules()[f".state-{kind}"]
    assert contrast(rule["color"], rule["background"]) >= AA, rule


def test_every_rule_with_both_colours_reaches_aa_contrast() -> None:
    checked = 0
    for selector, rule in _rules().items():
        colour, background = rule.get("color", ""), rule.get("background", "")
        if colour.startswith("#") and background.startswith("#"):
            assert contrast(colour, background) >= AA, (selector, rule)
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize(
    ("foreground", "background"),
    [
        ("--fg", "--bg"), ("--fg", "--card"), ("--muted", "--card"), ("--muted", "--bg"),
        ("--accent", "--card"), ("--bad", "--card"), ("#ffffff", "--accent"), ("#ffffff", "--bad"),
    ],
)  # fmt: skip
def test_text_colours_reach_aa_contrast_on_their_backgrounds(
    foreground: str, background: str
) -> None:
    variables = _variables()
    fg, bg = variables.get(foreground, foreground), variables.get(background, background)
    assert contrast(fg, bg) >= AA, (foreground, background)


def test_the_top_bar_reaches_aa_contrast() -> None:
    rules = _rules()
    bar = rules[".topbar"]["background"]
    for selector in (".topbar a", "button.link", ".brand span"):
        assert contrast(rules[selector]["color"], bar) >= AA, selector


def test_narrow_screens_get_their_own_layout() -> None:
    widths = [int(w) for w in re.findall(r"@media \(max-width:\s*(\d+)px\)", CSS)]
    assert widths and min(widths) >= 390
    rules = _rules()
    assert rules[".table-scroll"]["overflow-x"] == "auto"
    assert rules["pre.output"]["white-space"] == "pre-wrap"
    assert rules[".topbar"]["flex-wrap"] == "wrap"


def test_every_table_of_the_portal_scrolls_in_its_own_box() -> None:
    for template in sorted((ROOT / "templates" / "portal").glob("*.html")):
        text = template.read_text()
        tables = text.count("<table")
        if tables:
            assert text.count('class="table-scroll"') >= tables, template.name


def test_the_favicon_is_served(db: None) -> None:
    client = Client()
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/favicon.svg"
    assert client.get("/static/favicon.svg").status_code == 200
    page = client.get("/accounts/login/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg"' in page
