"""The list operations' query parameters that arrive as text and validate into lists
(`id=1,2`, `state=PENDING,RUNNING`, `user=a,b`, `fields=job_id,state`): serializer
fields whose schema states the same pattern they check, so that a client learns the
limits from the schema (tests/spurcloud/test_api_conformance.py sends what it allows and
what it rules out).

Apart from the views (spurcloud/api/views.py) that declare them in their filters: these
say only what one parameter accepts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from drf_spectacular.drainage import set_override
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from scheduler.core.contract import JobState, select_fields
from scheduler.core.errors import InvalidSpec

MAX_ID = 2**63 - 1  # job ids are 64-bit in the history: a larger one names no job
MAX_IDS = 1000  # ids in one filter


# Query parameters that arrive as text and validate into lists. An empty one filters
# nothing, as DRF treats every empty query parameter. The stubs fix a CharField's value
# to `str`, hence the overrides the type checker is told to accept.
ID_LIST = rf"^[0-9]{{1,18}}(,[0-9]{{1,18}}){{0,{MAX_IDS - 1}}}$"
_ONE_STATE = "|".join(s.value for s in JobState)
STATE_LIST = rf"^({_ONE_STATE})(,({_ONE_STATE}))*$"


@extend_schema_field({"type": "string", "pattern": ID_LIST})
class CommaIntegers(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=True, **kwargs)

    def to_internal_value(self, data: Any) -> list[int]:  # type: ignore[override]
        text = super().to_internal_value(data)
        if text and (not re.match(ID_LIST, text) or any(int(p) > MAX_ID for p in text.split(","))):
            raise serializers.ValidationError("must be a comma-separated list of job ids")
        return [int(p) for p in text.split(",") if p]


@extend_schema_field({"type": "string", "pattern": STATE_LIST})
class CommaStates(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=True, **kwargs)

    def to_internal_value(self, data: Any) -> list[str]:  # type: ignore[override]
        text = super().to_internal_value(data)
        if text and not re.match(STATE_LIST, text):
            raise serializers.ValidationError(
                f"must be a comma-separated list of states: {', '.join(JobState)}"
            )
        return [s for s in text.split(",") if s]


STATES_HELP = f"Comma-separated states: {', '.join(s.value for s in JobState)}."

MAX_NAMES = 100  # names in one list filter


class CommaNames(serializers.CharField):
    """A comma-separated list of names (users, accounts, partitions, job names): at most
    MAX_NAMES of them, each 1 to `item_max_length` characters (no comma, no NUL); any of
    them matches. The schema states the same pattern the view checks."""

    def __init__(self, *, item_max_length: int, **kwargs: Any) -> None:
        one = rf"[^,\u0000]{{1,{item_max_length}}}"
        self.pattern = rf"^{one}(,{one}){{0,{MAX_NAMES - 1}}}$"
        self.item_max_length = item_max_length
        # Untrimmed: the pattern is checked on the text as it came, as the schema says.
        # Not blank: an empty filter would match nothing, which no caller means (and a
        # blank alternative makes the schema a oneOf that "" satisfies twice).
        super().__init__(allow_blank=False, trim_whitespace=False, **kwargs)
        set_override(self, "field", {"type": "string", "pattern": self.pattern})

    def to_internal_value(self, data: Any) -> list[str]:  # type: ignore[override]
        text = super().to_internal_value(data)
        if not re.fullmatch(self.pattern, text):
            raise serializers.ValidationError(
                f"must be at most {MAX_NAMES} comma-separated names, each at most "
                f"{self.item_max_length} characters"
            )
        return text.split(",")


FIELDS_HELP = "Comma-separated job fields to answer with (the job id comes always)."


class CommaFields(serializers.CharField):
    """`fields=job_id,state`: the job object fields each job of a list answer is cut to
    (what a command prints, and nothing else travels), of those the answer has; the job
    id comes always. The schema states the pattern the view checks. (Added in a filter's
    `get_fields`: a declared field named `fields` would hide the serializer's own.)"""

    def __init__(self, *, allowed: Sequence[str]) -> None:
        one = "|".join(allowed)
        self.pattern = rf"^({one})(,({one}))*$"
        self.allowed = tuple(allowed)
        super().__init__(required=False, allow_blank=False, max_length=2000, help_text=FIELDS_HELP)
        set_override(self, "field", {"type": "string", "pattern": self.pattern})

    def to_internal_value(self, data: Any) -> tuple[str, ...]:  # type: ignore[override]
        text = super().to_internal_value(data)
        try:
            return select_fields(text.split(","), allowed=self.allowed)
        except InvalidSpec as exc:
            raise serializers.ValidationError(exc.message) from None
