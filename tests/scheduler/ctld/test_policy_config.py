"""spur.toml's scheduling policy: `[scheduler]`, `[[qos]]`, `[[accounts]]`, `[topology]`."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.config import ConfigError, parse
from scheduler.core.policy import Policy


def conf(**extra: Any) -> dict[str, Any]:
    return {"cluster": {"token": "t"}, **extra}


def test_without_policy_settings_the_default_policy_applies():
    assert parse(conf()).policy == Policy()


def test_it_reads_qos_accounts_the_scheduler_table_and_topology():
    config = parse(
        conf(
            scheduler={"shards_per_gpu": 4, "fairshare_half_life": "1-0", "backfill_depth": 8},
            qos=[
                {"name": "normal", "priority": 100, "preempt": ["spot"], "max_gpus_per_user": 16},
                {"name": "spot", "preempt_mode": "cancel", "grace_s": 5},
            ],
            accounts=[{"name": "ml", "shares": 4, "grp_gpus": 32}, {"name": "cv", "parent": "ml"}],
            topology={"blocks": [{"name": "b1", "nodes": "n[1-4]"}]},
            partitions=[
                {"name": "gpu", "default": True, "priority_tier": 2, "preempt_mode": "requeue"}
            ],
        )
    )
    policy = config.policy
    assert policy.qos["normal"].priority == 100
    assert policy.qos["normal"].max_gpus_per_user == 16
    assert policy.qos["spot"].preempt_mode == "cancel"
    assert policy.qos["spot"].grace_s == 5.0
    assert policy.accounts["ml"].grp_gpus == 32
    assert policy.accounts["cv"].parent == "ml"
    assert policy.shards_per_gpu == 4
    assert policy.fairshare_half_life_s == 86400.0
    assert policy.backfill_depth == 8
    assert policy.topology == {"blocks": [{"name": "b1", "nodes": "n[1-4]"}]}
    assert config.partitions[0].priority_tier == 2
    assert config.partitions[0].preempt_mode == "requeue"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"qos": [{"name": "normal", "colour": "red"}]}, "qos\\[0\\].colour"),
        ({"qos": [{"name": "normal", "priority": "high"}]}, "qos\\[0\\].priority"),
        ({"qos": [{"name": "normal", "preempt_mode": "suspend"}]}, "preempt_mode"),
        ({"qos": [{"name": "gold"}]}, "default QoS 'normal'"),
        ({"qos": [{"name": "normal", "preempt": ["gold"]}]}, "unknown QoS"),
        ({"qos": {"name": "normal"}}, "array of tables"),
        ({"accounts": [{"name": "ml", "shares": -1}]}, "shares"),
        ({"accounts": [{"name": "ml"}, {"name": "ml"}]}, "unique"),
        ({"scheduler": {"shards": 8}}, "scheduler.shards"),
        ({"scheduler": {"shards_per_gpu": 0}}, "shards_per_gpu"),
        ({"partitions": [{"name": "gpu", "preempt_mode": "x"}]}, "preempt_mode"),
        ({"topology": "tree"}, "topology must be a table"),
    ],
)
def test_a_malformed_policy_is_a_config_error_naming_the_key(extra: dict[str, Any], message: str):
    with pytest.raises(ConfigError, match=message):
        parse(conf(**extra))


def test_an_organisations_caps_come_from_the_scheduler_table():
    policy = parse(
        conf(scheduler={"max_submit_jobs_per_account": 50, "max_gpus_per_account": 16})
    ).policy
    implicit = policy.account("acme")  # a tenant's own account, not listed
    assert (implicit.name, implicit.max_submit_jobs, implicit.grp_gpus) == ("acme", 50, 16)
    assert Policy().account("acme").max_submit_jobs == 10_000  # the default cap
    uncapped = parse(conf(scheduler={"max_submit_jobs_per_account": 0})).policy
    assert uncapped.account("acme").max_submit_jobs is None
    with pytest.raises(ConfigError, match="max_gpus_per_account"):
        parse(conf(scheduler={"max_gpus_per_account": -1}))
