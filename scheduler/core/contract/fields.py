"""Field definitions: a field's name, kind, bounds and help, declared once beside it.

`JobSpec` declares each of its fields with `spec_field(...)`; `fields_of(JobSpec)` reads
them back as `FieldDef`s, which validate a value (`check`), convert it from and to its
JSON form (`from_wire`, `to_wire`), and let other layers build their own shapes (the
API's serializers and so the OpenAPI schema) from the same facts.

Every text is bounded and must be valid UTF-8 without NUL (it reaches file names,
environments and shells); every number is bounded; lists and maps are bounded in items.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from scheduler.core.errors import InvalidSpec


class Kind(StrEnum):
    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    STRINGS = "strings"  # a list of strings (a tuple in Python)
    STRING_MAP = "string_map"  # an object of strings (sorted pairs in Python)
    # Only in answers (the job object), never in a spec:
    TIME = "time"  # epoch seconds in the core; ISO 8601 UTC in the web API
    OBJECT = "object"  # a nested object described in its help


_KINDS: dict[Any, Kind] = {
    str: Kind.STRING,
    int: Kind.INTEGER,
    float: Kind.NUMBER,
    bool: Kind.BOOLEAN,
    tuple[str, ...]: Kind.STRINGS,
    tuple[tuple[str, str], ...]: Kind.STRING_MAP,
}


@dataclass(frozen=True)
class Bounds:
    """What `spec_field` records; the name and kind come from the dataclass field."""

    help: str
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None  # characters of a string; items of a list or map
    item_max_length: int | None = None  # characters of each item (and key) of a list or map
    stamped: bool = False  # set by the platform from the caller's identity, never by them


@dataclass(frozen=True)
class FieldDef:
    name: str
    kind: Kind
    nullable: bool
    default: Any
    bounds: Bounds

    @property
    def help(self) -> str:
        return self.bounds.help

    def from_wire(self, value: Any) -> Any:
        """The Python value of a JSON value, checked; InvalidSpec names the field."""
        if value is None and self.nullable:
            return None
        return self._convert(value)

    @functools.cached_property
    def _convert(self) -> Callable[[Any], Any]:
        """`from_wire` of a value that is not a null it may be, made once for this
        field's kind (as `_check_value`)."""
        kind, name = self.kind, self.name
        if kind is Kind.STRINGS:

            def strings(value: Any) -> Any:
                if not isinstance(value, list | tuple) or not all(
                    isinstance(v, str) for v in value
                ):
                    raise InvalidSpec(f"{name} must be a list of strings", field=name)
                return tuple(value)

            return strings
        if kind is Kind.STRING_MAP:

            def string_map(value: Any) -> Any:
                if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()
                ):
                    raise InvalidSpec(f"{name} must be an object of strings", field=name)
                return tuple(sorted(value.items()))

            return string_map
        if kind is Kind.BOOLEAN:

            def boolean(value: Any) -> Any:
                if value is not True and value is not False:
                    raise InvalidSpec(f"{name} must be true or false", field=name)
                return value

            return boolean
        if kind is Kind.INTEGER:

            def integer(value: Any) -> Any:
                if type(value) is not int and (
                    isinstance(value, bool) or not isinstance(value, int)
                ):
                    raise InvalidSpec(f"{name} must be an integer", field=name)
                return value

            return integer
        if kind is Kind.NUMBER:

            def number(value: Any) -> Any:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InvalidSpec(f"{name} must be a number", field=name)
                return float(value)

            return number

        def string(value: Any) -> Any:
            if type(value) is not str and not isinstance(value, str):
                raise InvalidSpec(f"{name} must be a string", field=name)
            return value

        return string

    def to_wire(self, value: Any) -> Any:
        if self.kind is Kind.STRINGS and value is not None:
            return list(value)
        if self.kind is Kind.STRING_MAP and value is not None:
            return dict(value)
        return value

    def check(self, value: Any) -> None:
        """Raise InvalidSpec unless the Python value is within the field's bounds."""
        if value is None:
            if not self.nullable:
                raise InvalidSpec(f"{self.name} must not be null", field=self.name)
            return
        self._check_value(value)

    @functools.cached_property
    def _check_value(self) -> Callable[[Any], None]:
        """`check` of a value that is not None, made once for this field's kind and
        bounds: every submission checks every field of its spec (on the web, then on the
        controller), most of them at their default."""
        b, name = self.bounds, self.name
        if self.kind in (Kind.INTEGER, Kind.NUMBER):
            low, high = b.minimum, b.maximum

            def number(value: Any) -> None:
                if isinstance(value, float) and not math.isfinite(value):
                    raise InvalidSpec(f"{name} must be a finite number", field=name)
                if low is not None and value < low:
                    raise InvalidSpec(f"{name} must be at least {_num(low)}", field=name)
                if high is not None and value > high:
                    raise InvalidSpec(f"{name} must be at most {_num(high)}", field=name)

            return number
        if self.kind is Kind.STRING:
            longest = b.max_length
            return lambda value: check_text(name, value, longest)
        if self.kind in (Kind.STRINGS, Kind.STRING_MAP):
            most, longest = b.max_length, b.item_max_length
            pairs = self.kind is Kind.STRING_MAP

            def texts(value: Any) -> None:
                if most is not None and len(value) > most:
                    raise InvalidSpec(f"{name} has more than {most} items", field=name)
                for item in (t for pair in value for t in pair) if pairs else value:
                    check_text(name, item, longest)

            return texts
        return lambda value: None  # a boolean: its type is all there is to it


def check_text(name: str, text: str, max_length: int | None) -> None:
    if max_length is not None and len(text) > max_length:
        raise InvalidSpec(f"{name} is longer than {max_length} characters", field=name)
    if "\x00" in text:
        raise InvalidSpec(f"{name} must not contain NUL characters", field=name)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSpec(f"{name} is not valid Unicode text", field=name) from None


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def spec_field(default: Any, help: str, **bounds: Any) -> Any:
    """A dataclass field carrying its contract (`Bounds`); see `fields_of`."""
    return dataclasses.field(default=default, metadata={"contract": Bounds(help, **bounds)})


def fields_of(cls: type) -> tuple[FieldDef, ...]:
    """The `FieldDef` of every field a dataclass declared with `spec_field`, in order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        bounds = f.metadata.get("contract")
        if bounds is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with spec_field")
        hint, nullable = hints[f.name], False
        args = typing.get_args(hint)
        if isinstance(hint, types.UnionType) and type(None) in args:
            (hint,) = [a for a in args if a is not type(None)]
            nullable = True
        kind = _KINDS.get(hint)
        if kind is None:
            raise TypeError(f"{cls.__name__}.{f.name}: no contract kind for {hint}")
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        out.append(FieldDef(f.name, kind, nullable, default, bounds))
    return tuple(out)


__all__ = ["Bounds", "FieldDef", "Kind", "check_text", "fields_of", "spec_field"]
