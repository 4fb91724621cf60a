"""The history list's last answers, kept by the web process for the history version they
were read at (`models.HistoryVersion`): `sacct` polled again and again over a history of
10,000 jobs that has not changed reads one row (the version) instead of 10,000.

An answer is kept under (organisation, its slug, history version, the request's absolute
URL: its filters, page, shape, and the host its `next` link names); any change to the
organisation's history gives a new version, so an answer kept is never one the database
would no longer give. The oldest answers go first, once more than `KEPT_JOBS` jobs are
kept in all (a page holds at most 50,000).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

KEPT_JOBS = 200_000  # jobs in all the answers kept, a few tens of MB at most


class KeptAnswers:
    """Answers by key, the least recently read dropped first beyond `capacity` jobs; safe
    to share between the web's request threads."""

    def __init__(self, capacity: int = KEPT_JOBS) -> None:
        self.capacity = capacity
        self._answers: OrderedDict[Hashable, tuple[int, Any]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], tuple[int, Any]]) -> Any:
        """The answer kept for `key`, else `make()`'s (its size in jobs, the answer),
        kept. `make` runs outside the lock: two readers of a new version may both make
        it, and get equal answers."""
        with self._lock:
            found = self._answers.get(key)
            if found is not None:
                self._answers.move_to_end(key)
                return found[1]
        size, answer = make()
        if size > self.capacity:
            return answer
        with self._lock:
            if key not in self._answers:
                self._answers[key] = (size, answer)
                self._held += size
                while self._held > self.capacity:
                    _, (dropped, _) = self._answers.popitem(last=False)
                    self._held -= dropped
        return answer

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()
            self._held = 0

    def __len__(self) -> int:
        return len(self._answers)


HISTORY = KeptAnswers()
