"""The cluster's GPU capacity over time, for utilisation (allocated GPU-hours over
capacity): an hourly sample of how many GPUs the cluster's nodes that are not down have
(`CapacitySample`, one per UTC hour, idempotent), taken by the beat task
`spur.billing.record_capacity`. A day's capacity is the mean of its samples times 24 h;
a day without samples (before sampling began, or while the controller did not answer)
has no known capacity, and its utilisation is shown as unknown rather than guessed."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.utils import timezone

from scheduler.rpc.errors import RpcError
from spurcloud.billing.models import CapacitySample

log = logging.getLogger(__name__)

GPU_MS_PER_DAY = 24 * 3_600_000  # milli-GPU-seconds one GPU gives in a day


def count_gpus(nodes: Iterable[dict[str, Any]]) -> int:
    """The GPU devices of the nodes that can run work (a down node's are not capacity)."""
    return sum(len(node.get("gpus") or ()) for node in nodes if node.get("state") != "down")


def live_gpus() -> int | None:
    """The cluster's GPUs now, from the controller; None when it does not answer."""
    from spurcloud.jobs.selectors import cluster_nodes  # jobs imports billing

    try:
        return count_gpus(cluster_nodes(operator=True))
    except RpcError as exc:
        log.warning("capacity: the controller did not answer: %s", exc)
        return None


def record_capacity(*, now: datetime | None = None) -> int | None:
    """Samples the cluster's GPUs for this hour (again: the last answer wins)."""
    gpus = live_gpus()
    if gpus is None:
        return None
    hour = (now or timezone.now()).astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    CapacitySample.objects.update_or_create(hour=hour, defaults={"gpus": gpus})
    return gpus


def daily_capacity(*, since: date, until: date, today_live: int | None = None) -> dict[date, int]:
    """Capacity in milli-GPU-seconds of each day from `since` to `until` that has
    samples; `today_live` (the page's own reading) counts as one more sample of `until`."""
    sums: dict[date, list[int]] = defaultdict(lambda: [0, 0])
    start = datetime.combine(since, time(), tzinfo=UTC)
    end = datetime.combine(until + timedelta(days=1), time(), tzinfo=UTC)
    for hour, gpus in CapacitySample.objects.filter(hour__gte=start, hour__lt=end).values_list(
        "hour", "gpus"
    ):
        day = hour.astimezone(UTC).date()
        sums[day][0] += gpus
        sums[day][1] += 1
    if today_live is not None:
        sums[until][0] += today_live
        sums[until][1] += 1
    return {day: total * GPU_MS_PER_DAY // n for day, (total, n) in sums.items() if n}
