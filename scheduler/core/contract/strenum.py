"""`enum.StrEnum`, as much of it as the job contract's states use, without the enum module.

The Slurm commands read the states (squeue's codes, sacct's kinds) at start-up, and
`enum`, with the `functools` and `collections` it imports, costs about a third of the
interpreter's own start (tests/scheduler/cli/test_startup.py). So the states are built on
this small class, written exactly as an enum is, and the type checker is shown
`enum.StrEnum` itself (the alias at the end), whose semantics these are:
tests/scheduler/core/test_strenum.py holds the two to the same behaviours.

Each public name in a class body that is not a function, property or other descriptor is
a member, made by the class's `__new__` with the value (a tuple's items, if it is one) as
its arguments. A member is a `str` equal to its value, and prints, formats and hashes as
it; the class iterates over its members in the body's order and looks one up by value
(`JobState("PENDING")`, ValueError for an unknown one) or by name (`JobState["PENDING"]`).
A member pickles as `enum` pickles one, a call of its class with its value, so a Raft
snapshot written by either version loads in the other, to the same member.

What it is not: an `enum.Enum` at run time, so a library that asks (drf-spectacular does)
is given the values instead (spurcloud/settings.py); nor has it aliases, `auto()` or
`_missing_`, which the states never used.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (mypy reads it so)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, Self


class LightStrEnumType(type):
    """The class's side: its members, in order, by name and by value."""

    _member_map_: dict[str, Any]
    _value2member_map_: dict[str, Any]

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]
    ) -> LightStrEnumType:
        body = {
            key: value
            for key, value in namespace.items()
            if not key.startswith("_") and not hasattr(value, "__get__")
        }
        for key in body:
            del namespace[key]
        cls = super().__new__(mcs, name, bases, namespace)
        new: Any = cls.__new__  # the class's own (a member's), not this one
        cls._member_map_ = {}
        cls._value2member_map_ = {}
        for key, definition in body.items():
            args = definition if isinstance(definition, tuple) else (definition,)
            member = new(cls, *args)
            member._name_ = key
            if not isinstance(member._value_, str) or member._value_ in cls._value2member_map_:
                raise ValueError(f"{name}.{key}: {member._value_!r} is not a new str value")
            cls._member_map_[key] = cls._value2member_map_[member._value_] = member
            setattr(cls, key, member)
        return cls

    def __call__(cls, value: object) -> Any:
        # Only a lookup: the members were all made with the class.
        try:
            return cls._value2member_map_[value]  # type: ignore[index]  # any value: KeyError
        except (KeyError, TypeError):  # TypeError: an unhashable value
            raise ValueError(f"{value!r} is not a valid {cls.__qualname__}") from None

    def __getitem__(cls, name: str) -> Any:
        return cls._member_map_[name]

    def __iter__(cls) -> Iterator[Any]:
        return iter(cls._member_map_.values())

    def __len__(cls) -> int:
        return len(cls._member_map_)

    def __contains__(cls, value: object) -> bool:
        # A member or a value (Python 3.12's enum answers both so).
        try:
            return value in cls._value2member_map_
        except TypeError:
            return False


class LightStrEnum(str, metaclass=LightStrEnumType):
    """The members' side: `str` instances equal to their value, with a name."""

    _name_: str
    _value_: str

    def __new__(cls, value: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        return member

    @property
    def name(self) -> str:
        return self._name_

    @property
    def value(self) -> str:
        return self._value_

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self._name_}: {self._value_!r}>"

    def __reduce_ex__(self, protocol: object) -> tuple[type[Self], tuple[str]]:
        return type(self), (self._value_,)

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: object) -> Self:
        return self


if TYPE_CHECKING:
    from enum import StrEnum as StrEnum
else:
    StrEnum = LightStrEnum
