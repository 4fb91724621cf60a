"""The API's rate limits, per client address, per token, and for job submissions per
organisation; each a number of requests a minute, from settings (`API_*_PER_MINUTE_*`).
Over a limit the API answers 429 with `Retry-After` (seconds) and says which limit.

They count on the shared cache (settings.CACHES: Redis in production, so every web
process sees one count), in fixed one-minute windows with the cache's atomic add and
incr. Not DRF's SimpleRateThrottle: it keeps a list of timestamps that each request
reads, changes and writes back, so concurrent requests in several processes overwrite
each other's entries and a flood gets through faster than the rate. A fixed window lets a
client send up to twice the rate across a window's edge, which is harmless here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from spurcloud.tenants.models import ApiToken

WINDOW_S = 60


class PerMinuteThrottle(BaseThrottle):
    scope = ""
    setting = ""  # the name of the setting with the limit (requests a minute)

    def __init__(self) -> None:
        self.limit = int(getattr(settings, self.setting))
        self.retry_after: float | None = None

    def ident(self, request: Request, view: Any) -> str | None:
        """What is counted (None: this request is not)."""
        raise NotImplementedError

    def refusal(self) -> str:
        raise NotImplementedError

    def cost(self, request: Request) -> int:
        """How many this request counts for."""
        return 1

    def key(self, request: Request, view: Any, now: float) -> str | None:
        """The counter this request adds to now (None: this request is not counted)."""
        ident = self.ident(request, view)
        if ident is None:
            return None
        return f"throttle:{self.scope}:{ident}:{int(now // WINDOW_S)}"

    def judge(self, count: int, now: float) -> bool:
        """Whether the window's count, this request's cost included, is within the limit."""
        if count <= self.limit:
            return True
        self.retry_after = (int(now // WINDOW_S) + 1) * WINDOW_S - now
        return False

    def allow_request(self, request: Request, view: Any) -> bool:
        return _allow([self], request, view) == []

    def wait(self) -> float | None:
        return self.retry_after


def counts(increments: Sequence[tuple[str, int]]) -> list[int]:
    """Each counter's value after adding its cost: on Redis in one round trip; on another
    cache (the embedded platform's memory, the tests') with its atomic add and incr."""
    if not increments:
        return []
    backend = caches["default"]
    if isinstance(backend, RedisCache):
        pipe = backend._cache.get_client(write=True).pipeline(transaction=False)
        for key, cost in increments:
            name = backend.make_and_validate_key(key)
            pipe.incrby(name, cost)
            # The key outlives its window a little, so that it never expires between the two.
            pipe.expire(name, WINDOW_S + 5)
        answers = pipe.execute()
        return [int(answers[2 * i]) for i in range(len(increments))]
    out = []
    for key, cost in increments:
        # `backend`, not the `cache` proxy: each of its calls looks the cache up again.
        # The window's counter is there but for its first request: incr first, and add
        # only when it is missing (an add and an incr each time were twice the work).
        try:
            out.append(backend.incr(key, cost))
        except ValueError:  # the window's first request (or its counter evicted)
            if backend.add(key, cost, timeout=WINDOW_S + 5):
                out.append(cost)
            else:  # another thread's first request came in between
                out.append(backend.incr(key, cost))
    return out


def _allow(
    throttles: Sequence[PerMinuteThrottle], request: Request, view: Any
) -> list[PerMinuteThrottle]:
    """Counts the request against each throttle, all in one `counts`; the ones that
    refuse it."""
    now = time.time()
    keyed = [(t, t.key(request, view, now)) for t in throttles]
    counted = [(t, key) for t, key in keyed if key is not None]
    found = counts([(key, t.cost(request)) for t, key in counted])
    return [t for (t, _), count in zip(counted, found, strict=True) if not t.judge(count, now)]


class IpRateThrottle(PerMinuteThrottle):
    """Every request from one client address (behind TRUSTED_PROXY_COUNT proxies, the
    address they saw); checked before the token is looked up."""

    scope = "ip"
    setting = "API_REQUESTS_PER_MINUTE_PER_IP"

    def ident(self, request: Request, view: Any) -> str | None:
        return self.get_ident(request) or None

    def refusal(self) -> str:
        return f"Too many requests from your address (at most {self.limit} a minute)."


class TokenRateThrottle(PerMinuteThrottle):
    scope = "token"
    setting = "API_REQUESTS_PER_MINUTE_PER_TOKEN"

    def ident(self, request: Request, view: Any) -> str | None:
        token = request.auth
        return str(token.pk) if isinstance(token, ApiToken) else None

    def refusal(self) -> str:
        return f"Too many requests with this API token (at most {self.limit} a minute)."


class OrganizationSubmitThrottle(PerMinuteThrottle):
    """Job submissions by all the members of one organisation together: one tenant's
    script in a loop cannot flood the scheduler's queue and log for everyone."""

    scope = "submit"
    setting = "API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION"

    def ident(self, request: Request, view: Any) -> str | None:
        token = request.auth
        return str(token.organization_id) if isinstance(token, ApiToken) else None

    def cost(self, request: Request) -> int:
        # A bulk submission (a list) counts each of its jobs; a malformed or oversized
        # one is refused after, by the view, and counts as one.
        data = request.data
        if isinstance(data, list) and len(data) <= settings.API_MAX_BULK_SUBMIT:
            return max(len(data), 1)
        return 1

    def refusal(self) -> str:
        return (
            f"Your organisation has sent {self.limit} job submissions in the last minute, "
            "its limit: wait before submitting more (or submit a job array)."
        )


def check_throttles(throttles: Sequence[BaseThrottle], request: Request, view: Any) -> None:
    """Counts the request against every throttle (as DRF does; the per-minute ones in one
    round trip); raises Throttled (429, Retry-After) with the message of the one that
    waits longest when any refuses."""
    per_minute = [t for t in throttles if isinstance(t, PerMinuteThrottle)]
    refused: list[BaseThrottle] = list(_allow(per_minute, request, view)) if per_minute else []
    refused += [
        t
        for t in throttles
        if not isinstance(t, PerMinuteThrottle) and not t.allow_request(request, view)
    ]
    if refused:
        longest = max(refused, key=lambda t: t.wait() or 0.0)
        detail = longest.refusal() if isinstance(longest, PerMinuteThrottle) else None
        raise Throttled(wait=longest.wait(), detail=detail)
