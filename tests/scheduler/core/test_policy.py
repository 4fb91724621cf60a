"""Policy as replicated state: QoS, accounts and scheduler knobs."""

from __future__ import annotations

import pytest

from scheduler.core import commands as c
from scheduler.core.errors import Rejected
from scheduler.core.policy import Account, Policy, QoS
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit


def test_the_default_policy_has_normal_and_spot_which_normal_may_preempt():
    policy = Policy()
    assert set(policy.qos) == {"normal", "spot", "interactive"}
    assert policy.may_preempt("normal", "spot")
    assert policy.may_preempt("interactive", "spot")  # the portal's sessions
    assert not policy.may_preempt("interactive", "normal")
    assert policy.qos["interactive"].preempt_mode == "cancel"
    assert policy.may_preempt("", "spot")  # "" is the default QoS
    assert not policy.may_preempt("spot", "normal")
    assert policy.shards_per_gpu == 8
    assert policy.fairshare_half_life_s == 7 * 86400
    assert policy.account("acme").shares == 1


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (Policy.of([QoS("spot")]), "default QoS 'normal'"),
        (Policy.of([QoS("normal", preempt=("gold",))]), "unknown QoS: gold"),
        (Policy.of([QoS("normal", preempt_mode="suspend")]), "requeue or cancel"),
        (Policy.of([QoS("normal", grace_s=-1)]), "grace_s"),
        (Policy.of(accounts=[Account("a", shares=0)]), "shares"),
        (Policy.of(accounts=[Account("a", parent="nowhere")]), "unknown parent"),
        (Policy.of(accounts=[Account("a", parent="b"), Account("b", parent="a")]), "cycle"),
        (Policy.of(shards_per_gpu=0), "shards_per_gpu"),
        (Policy.of(fairshare_half_life_s=0), "half-life"),
    ],
)
def test_a_contradictory_policy_is_refused_and_the_old_one_kept(policy: Policy, message: str):
    state = cluster(gpu_node("n1"))
    before = state.to_bytes()
    with pytest.raises(Rejected, match=message):
        state.apply(c.ConfigurePolicy(cmd_id(), 1.0, policy))
    assert state.to_bytes() == before


def test_a_configured_policy_is_part_of_the_replicated_bytes():
    state = cluster(gpu_node("n1"))
    before = state.to_bytes()
    policy = Policy.of([QoS("normal", priority=10), QoS("low")], [Account("ml", shares=3)])
    state.apply(c.ConfigurePolicy(cmd_id(), 1.0, policy))
    assert state.policy == policy
    assert state.to_bytes() != before
    assert state.jobs[submit(state, qos="low", account="ml")].qos == "low"
    assert state.jobs[submit(state)].qos == "normal"


def test_topology_is_passed_through_for_placement():
    state = cluster(gpu_node("n1"))
    topo = {"switches": [{"name": "s1", "nodes": "n1"}]}
    state.apply(c.ConfigurePolicy(cmd_id(), 1.0, Policy.of(topology=topo)))
    assert state.topology == topo


def test_partitions_refuse_an_unknown_preempt_mode():
    state = cluster(gpu_node("n1"))
    with pytest.raises(Rejected, match="preempt_mode"):
        state.apply(
            c.ConfigurePartitions(cmd_id(), 1.0, (c.PartitionDef("gpu", preempt_mode="x"),))
        )
