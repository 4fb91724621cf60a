"""Strict readers for settings taken from environment variables.

A malformed value is an `ImproperlyConfigured` error at start-up, never a silent
default: `DEBUG=ture` must not quietly mean False in production. Secrets may come from a
file named by `<NAME>_FILE` (Docker and Kubernetes secrets), which wins over `<NAME>`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_str(name: str, default: str, *, environ: Mapping[str, str] | None = None) -> str:
    """The variable, or `default` when it is unset or empty; `<NAME>_FILE` wins."""
    env = os.environ if environ is None else environ
    path = env.get(f"{name}_FILE", "")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {path}: {exc}") from exc
    value = env.get(name, "")
    return value if value != "" else default


def env_bool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    raw = env_str(name, "", environ=environ).strip().lower()
    if raw == "":
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false, 1/0, yes/no), not {raw!r}")


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    raw = env_str(name, "", environ=environ).strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, not {value}")
    return value


def env_float(
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    raw = env_str(name, "", environ=environ).strip()
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name} must be a finite number, not {raw!r}")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    return value


def env_list(
    name: str, default: list[str], *, environ: Mapping[str, str] | None = None
) -> list[str]:
    """A comma-separated list; blanks around items are dropped, and so are empty items."""
    raw = env_str(name, "", environ=environ)
    if raw.strip() == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(
    name: str, default: str, choices: set[str], *, environ: Mapping[str, str] | None = None
) -> str:
    value = env_str(name, default, environ=environ).strip().lower()
    if value not in choices:
        allowed = ", ".join(sorted(choices))
        raise ImproperlyConfigured(f"{name} must be one of {allowed}, not {value!r}")
    return value


def env_match(
    name: str,
    default: str,
    pattern: str,
    *,
    expected: str,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The variable when it matches `pattern` (the whole value), e.g. a rate such as
    `600/min`; `expected` says in words what it must look like."""
    value = env_str(name, default, environ=environ).strip()
    if not re.fullmatch(pattern, value):
        raise ImproperlyConfigured(f"{name} must be {expected}, not {value!r}")
    return value
