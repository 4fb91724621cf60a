"""The checked readers of one `spur.toml` value, and `ConfigError`.

Each reader takes the table, where it is (`"agent"`, `"qos[2]"`) and the key, and either
returns a value of the one type the key takes or raises `ConfigError` naming the key:
a wrong type is never read as a default. Apart from `config.py`, which says what the
file holds; these say only how one value is read.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    pass


def get_positive_int(data: dict[str, Any], where: str, key: str, default: int) -> int:
    value = get_int(data, where, key, default)
    if value < 1:
        raise ConfigError(f"{where}.{key} must be a positive integer")
    return value


def get_tables(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{key} must be an array of tables ([[{key}]])")
    return value


def get_int(data: dict[str, Any], where: str, key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}.{key} must be a non-negative integer")
    return value


def get_opt_int(data: dict[str, Any], where: str, key: str) -> int | None:
    return None if data.get(key) is None else get_int(data, where, key, 0)


def get_choice(
    data: dict[str, Any], where: str, key: str, allowed: tuple[str, ...], default: str
) -> str:
    value = get_str(data, where, key, default)
    if value not in allowed:
        shown = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{where}.{key} must be one of: {shown}")
    return value


def get_table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table")
    return value


def only(data: dict[str, Any], where: str, allowed: set[str]) -> None:
    unknown = set(data) - allowed
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"unknown setting(s): {', '.join(prefix + k for k in sorted(unknown))}")


def get_str(data: dict[str, Any], where: str, key: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key} must be a string")
    return value


def get_strs(data: dict[str, Any], where: str, key: str, default: list[str]) -> list[str]:
    value = data.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{key} must be an array of strings")
    return value


def get_str_map(data: dict[str, Any], where: str, key: str) -> dict[str, str]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where}.{key} must be a table of strings")
    return value


def get_num(
    data: dict[str, Any],
    where: str,
    key: str,
    default: float,
    *,
    zero: bool = False,
    most: float | None = None,
) -> float:
    """A positive number (or zero, where `zero`), at most `most` where given."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}.{key} must be a number")
    if value < 0 or (value == 0 and not zero):
        sign = "non-negative" if zero else "positive"
        raise ConfigError(f"{where}.{key} must be a {sign} number")
    if most is not None and value > most:
        raise ConfigError(f"{where}.{key} must be at most {most:g}")
    return float(value)


def get_bool(data: dict[str, Any], where: str, key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false")
    return value


def get_minutes(data: dict[str, Any], where: str, key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        from scheduler.slurm.timefmt import parse_time_minutes

        try:
            return parse_time_minutes(value)
        except ValueError as exc:
            raise ConfigError(f"{where}.{key}: {exc}") from exc
    raise ConfigError(f"{where}.{key} must be minutes or a Slurm time string")
