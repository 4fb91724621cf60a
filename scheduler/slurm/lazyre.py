"""A regular expression compiled where it is first used, not where it is defined: the
Slurm commands start without importing `re` (about 5 ms, a third of the interpreter's
own start) unless the command line needs a pattern (tests/scheduler/cli/test_startup.py).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Iterator
    from re import Match, Pattern


class LazyPattern:
    """`re.compile(source)`, compiled by the first call of one of its methods."""

    __slots__ = ("_compiled", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self._compiled: Pattern[str] | None = None

    def compiled(self) -> Pattern[str]:
        if self._compiled is None:
            import re

            self._compiled = re.compile(self.source)
        return self._compiled

    def match(self, text: str) -> Match[str] | None:
        return self.compiled().match(text)

    def fullmatch(self, text: str) -> Match[str] | None:
        return self.compiled().fullmatch(text)

    def finditer(self, text: str) -> Iterator[Match[str]]:
        return self.compiled().finditer(text)
