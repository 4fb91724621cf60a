"""The estimate's arithmetic: what a spec may hold (GPUs, CPUs, memory, by the node's
rules) times its prices and time limit, in its QoS class, rounded up; no database."""

from __future__ import annotations

from typing import Any

from scheduler.core.contract import JobSpec
from spurcloud.billing.quotes import Holds, Rates, holds_of, spec_quote

NODES = [
    {"name": "a", "cpus": 16, "memory_mb": 64_000, "gpus": [{"model": "h100"}]},
    {"name": "b", "cpus": 64, "memory_mb": 512_000, "gpus": [{"model": "mi300x"}]},
]
PRICED = Rates(gpu_hour_micro=2_500_000, cpu_hour_micro=20_000, mem_gb_hour_micro=5_000)
PRICES = {
    ("h100", "on_demand"): PRICED,
    ("h100", "spot"): Rates(1_000_000),
    ("mi300x", "on_demand"): Rates(3_000_000),
    ("", "on_demand"): Rates(0, cpu_hour_micro=30_000),
}


def _spec(**fields: Any) -> JobSpec:
    return JobSpec.from_dict({"script": "#!/bin/sh\ntrue\n", "time_limit_min": 60, **fields})


def _nodes() -> list[dict[str, Any]]:
    return NODES


def test_memory_follows_the_nodes_rules() -> None:
    def holds(**fields: Any) -> Holds:
        return holds_of(_spec(**fields), nodes=_nodes, charged=PRICED)

    # No --mem: the node's memory per CPU (the largest of the cluster: 8,000 MiB on b).
    assert holds(gpus=1, cpus_per_task=2) == Holds(1000, 2, 16_000)
    assert holds(gpus=1, mem_per_node_mb=1000) == Holds(1000, 1, 1000)
    assert holds(gpus=1, mem_per_node_mb=0) == Holds(1000, 1, 512_000)  # --mem=0: a whole node
    assert holds(gpus=2, nodes=2, exclusive=True) == Holds(2000, 128, 1_024_000)


def test_the_nodes_are_not_read_when_cpu_and_memory_cost_nothing() -> None:
    def unreachable() -> list[dict[str, Any]]:
        raise AssertionError("the nodes were read")

    assert holds_of(_spec(gpus=1), nodes=unreachable, charged=Rates(2_500_000)) == Holds(1000, 1)


def test_a_spot_job_is_priced_spot_and_any_model_the_dearest() -> None:
    spot = spec_quote(
        _spec(gpus=2, qos="spot", gpu_type="h100"), partitions=list, nodes=_nodes, prices=PRICES
    )
    assert spot is not None and spot.micro == 2_000_000
    anywhere = spec_quote(_spec(gpus=1), partitions=list, nodes=_nodes, prices=PRICES)
    # h100: 2.50 + 1 CPU 0.02 + 8,000 MiB 0.0390625 = 2.5590625; mi300x: 3.00.
    assert anywhere is not None and anywhere.micro == 3_000_000


def test_a_cpu_only_job_is_priced_by_the_default_entry_and_an_array_per_task() -> None:
    cpu_only = spec_quote(_spec(cpus_per_task=4), partitions=list, nodes=_nodes, prices=PRICES)
    assert cpu_only is not None and cpu_only.micro == 120_000
    assert "0.03 USD per CPU-hour × 4 CPU × 60 min" in cpu_only.why
    array = spec_quote(
        _spec(cpus_per_task=4, array="0-9"), partitions=list, nodes=_nodes, prices=PRICES
    )
    assert array is not None and array.micro == 1_200_000
    assert (
        spec_quote(_spec(gpus=1, gpu_type="unknown"), partitions=list, nodes=_nodes, prices={})
        is None
    )
