"""Nothing runs unbounded: every partition, the built-in one and each configured one, has
a default and a maximum time limit (a job's cost estimate needs one); a job without
--time gets the default, and one over the maximum is refused with Slurm's message before
it reaches the Raft log."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduler.config import DEFAULT_MAX_TIME_MIN, DEFAULT_TIME_MIN, ConfigError, SpurConfig, parse
from scheduler.core.time_limits import TIME_LIMIT_REFUSED
from scheduler.rpc.errors import RpcError
from tests.fixtures.controller import RunningController
from tests.scheduler.core.factories import gpu_node, spec

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
    assert (part.max_time_min, part.default_time_min) == (120, DEFAULT_TIME_MIN)
    config = parse(
        {"partitions": [{"name": "a", "max_time": 30, "default_time": "0:10:00"}]}, env=TOKEN
    )
    (part,) = config.partitions
    assert (part.max_time_min, part.default_time_min) == (30, 10)


def test_a_configured_partition_without_limits_gets_the_sites_defaults() -> None:
    config = parse({"partitions": [{"name": "a"}, {"name": "b", "max_time": 20}]}, env=TOKEN)
    a, b = config.partitions
    assert (a.max_time_min, a.default_time_min) == (DEFAULT_MAX_TIME_MIN, DEFAULT_TIME_MIN)
    # The default is never above the partition's own maximum.
    assert (b.max_time_min, b.default_time_min) == (20, 20)


@pytest.mark.parametrize(
    "part,message",
    [
        ({"name": "a", "max_time": "UNLIMITED"}, "needs a maximum time limit"),
        ({"name": "a", "max_time": 0}, "needs a maximum time limit"),
        ({"name": "a", "max_time": 60, "default_time": 90}, "no longer than max_time"),
        ({"name": "a", "default_time": "INFINITE"}, "no longer than max_time"),
        ({"name": "a", "max_time": "soon"}, "partitions[0].max_time"),
    ],
)
def test_an_unbounded_or_inconsistent_limit_is_a_configuration_error(
    part: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse({"partitions": [part]}, env=TOKEN)


def _log_last_index(controller: RunningController) -> int:
    with controller.client() as client:
        return int(client.call("GET", "/v1/raft")["replica"]["log_last_index"])


def test_jobs_get_the_default_and_one_over_the_maximum_is_refused_before_the_log(
    controller: RunningController,
) -> None:
    # The fixture's configured partition "gpu" sets no limits: it has the site's.
    held = {"hold": True}  # held jobs wait: no scheduling pass writes to the log meanwhile
    with controller.client() as client:
        client.register_node(gpu_node("n1", gpus=1).to_dict())
        (part,) = client.partitions()
        assert (part["default_time_min"], part["max_time_min"]) == (
            DEFAULT_TIME_MIN,
            DEFAULT_MAX_TIME_MIN,
        )
        job = client.submit(spec(**held).to_dict())
        assert job["time_limit_min"] == DEFAULT_TIME_MIN
        before = _log_last_index(controller)
        for minutes in (DEFAULT_MAX_TIME_MIN + 1, 0):
            with pytest.raises(RpcError, match=re.escape(TIME_LIMIT_REFUSED)):
                client.submit(spec(time_limit_min=minutes, **held).to_dict())
        # The batch route refuses the one, commits the other.
        refused, accepted = client.submit_many(
            [
                (spec(time_limit_min=DEFAULT_MAX_TIME_MIN + 1, **held).to_dict(), ""),
                (spec(time_limit_min=DEFAULT_MAX_TIME_MIN, **held).to_dict(), ""),
            ]
        )
        assert isinstance(refused, RpcError) and refused.message == TIME_LIMIT_REFUSED
        assert isinstance(accepted, dict)
        assert accepted["time_limit_min"] == DEFAULT_MAX_TIME_MIN
    # Only the accepted job took a log entry.
    assert _log_last_index(controller) == before + 1
