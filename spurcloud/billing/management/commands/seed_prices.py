"""`spurcloud manage seed_prices`: a demo price book, for `spurcloud up` and for trying
billing. Only into an empty book: a site that has prices keeps them (prices are never
edited once in effect), so running it again changes nothing.

One on-demand and one spot entry for each GPU model the demo's simulated nodes have
(`spurcloud up --nodes`, default mi300x and h100), one pair for every other model (and
CPU-only jobs), each with CPU and memory prices; in effect from now. Prints one JSON
line, `{"created": N}`."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from spurcloud.billing.models import PriceEntry, QosClass

# Per hour, in micro-units: (GPU, CPU, GiB of memory), on-demand; spot is 40% of it.
DEMO_PRICES = {
    "mi300x": (3_000_000, 20_000, 5_000),
    "h100": (2_500_000, 20_000, 5_000),
    "": (1_500_000, 20_000, 5_000),  # any other model, and CPU-only jobs
}
SPOT_SHARE = (2, 5)


class Command(BaseCommand):
    help = "Fill an empty price book with a demo one (idempotent)."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        created = 0
        if not PriceEntry.objects.exists():
            now = timezone.now().replace(microsecond=0)
            share, of = SPOT_SHARE
            entries = []
            for model, (gpu, cpu, mem) in DEMO_PRICES.items():
                for qos, factor in ((QosClass.ON_DEMAND, (1, 1)), (QosClass.SPOT, (share, of))):
                    entries.append(
                        PriceEntry(
                            gpu_model=model,
                            qos_class=qos,
                            effective_from=now,
                            gpu_hour_micro=gpu * factor[0] // factor[1],
                            cpu_hour_micro=cpu * factor[0] // factor[1],
                            mem_gb_hour_micro=mem * factor[0] // factor[1],
                        )
                    )
            created = len(PriceEntry.objects.bulk_create(entries))
        self.stdout.write(json.dumps({"created": created}))
