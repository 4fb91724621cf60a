"""Nothing runs unbounded: without [[partitions]], the built-in default partition has a
default and a maximum time limit (a job's cost estimate needs one)."""

from __future__ import annotations

from scheduler.config import DEFAULT_MAX_TIME_MIN, DEFAULT_TIME_MIN, SpurConfig, parse

TOKEN = {"SPUR_CLUSTER_TOKEN": "t" * 32}


def test_the_built_in_partition_has_a_default_and_a_maximum_time_limit() -> None:
    for config in (SpurConfig(), parse({}, env=TOKEN)):
        (part,) = config.partitions
        assert part.default and part.name == "gpu"
        assert (part.default_time_min, part.max_time_min) == (
            DEFAULT_TIME_MIN,
            DEFAULT_MAX_TIME_MIN,
        )
        assert 0 < part.default_time_min <= part.max_time_min


def test_configured_partitions_keep_their_own_limits() -> None:
    config = parse(
        {"partitions": [{"name": "a", "default": True, "max_time": "2:00:00"}]}, env=TOKEN
    )
    (part,) = config.partitions
    assert (part.max_time_min, part.default_time_min) == (120, None)
