from __future__ import annotations

import pytest

from scheduler.core import commands as c
from scheduler.core.limits import Usage, limit_reason
from scheduler.core.planner import plan
from scheduler.core.policy import Account, Policy, QoS
from scheduler.core.priority import Ranker, Weights, fairshare_factors, ranker
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit


def test_an_account_that_used_nothing_has_full_fairshare_and_one_at_its_share_half():
    factors = fairshare_factors({"a": 1, "b": 1}, {"a": 0.0, "b": 100.0}, ["a", "b"])
    assert factors["a"] == 1.0
    assert factors["b"] == pytest.approx(2**-2)  # used all, owns half
    even = fairshare_factors({"a": 1, "b": 1}, {"a": 50.0, "b": 50.0}, ["a", "b"])
    assert even == {"a": 0.5, "b": 0.5}


def test_fairshare_with_no_usage_anywhere_is_equal():
    assert fairshare_factors({"a": 3, "b": 1}, {}, ["a", "b"]) == {"a": 1.0, "b": 1.0}


def make_ranker(**kw) -> Ranker:
    base = dict(now=1000.0, weights=Weights(), fairshare={}, qos={}, partition={}, cluster_gpus=16)
    base.update(kw)
    return Ranker(**base)


def test_older_jobs_rank_higher_and_age_saturates():
    state = cluster(gpu_node("sim01"))
    old = state.jobs[submit(state, now=0.0)]
    new = state.jobs[submit(state, now=900.0)]
    r = make_ranker(weights=Weights(max_age_s=500.0))
    assert r.factors(old).age == 1.0
    assert r.factors(new).age == pytest.approx(0.2)
    assert r.factors(old).priority > r.factors(new).priority


def test_each_factor_is_visible_and_nice_lowers_priority():
    state = cluster(gpu_node("sim01"))
    job = state.jobs[submit(state, now=1000.0, gpus_per_node=8, nice=100)]
    r = make_ranker(fairshare={"acme": 0.5}, qos={"normal": 1.0})
    f = r.factors(job)
    assert (f.fairshare, f.qos, f.size, f.nice) == (0.5, 1.0, 0.5, 100)
    assert f.priority == 10_000 * 0.5 + 10_000 * 1.0 + 1_000 * 0.5 - 100
    assert set(f.to_dict()) == {"age", "fairshare", "qos", "partition", "size", "nice", "priority"}


def test_an_account_that_used_the_gpus_ranks_below_one_that_did_not():
    state = cluster(gpu_node("sim01"))
    used = submit(state, now=1000.0, tenant="heavy", gpus_per_node=8)
    state.apply(plan(state, now=1000.0, cmd_id=cmd_id()))
    state.apply(c.JobFinished(cmd_id(), 4600.0, used, 1, "sim01", 0, 0))
    heavy = state.jobs[submit(state, now=5000.0, tenant="heavy")]
    light = state.jobs[submit(state, now=5000.0, tenant="light")]
    assert state.usage("heavy", 5000.0) > 0 == state.usage("light", 5000.0)
    r = ranker(state, 5000.0)
    assert r.factors(light).fairshare == 1.0 > r.factors(heavy).fairshare
    assert r.factors(light).priority > r.factors(heavy).priority


def with_policy(state, **kw):
    state.apply(c.ConfigurePolicy(cmd_id(), 1000.0, Policy.of(**kw)))
    return state


def test_a_user_at_the_qos_gpu_limit_waits_with_slurms_reason():
    state = with_policy(cluster(gpu_node("sim01")), qos=[QoS("normal", max_gpus_per_user=4)])
    job = state.jobs[submit(state, gpus_per_node=2)]
    usage = Usage()
    assert limit_reason(state, job, usage) is None
    usage.gpus_by_user[("normal", "alice")] = 3
    assert limit_reason(state, job, usage) == "QOSMaxGRESPerUser"


def test_an_account_over_its_gpu_quota_waits_on_assoc_grp_gres():
    state = with_policy(cluster(gpu_node("sim01")), accounts=[Account("acme", grp_gpus=2)])
    job = state.jobs[submit(state, gpus_per_node=1)]
    usage = Usage()
    usage.gpus_by_account["acme"] = 2
    assert limit_reason(state, job, usage) == "AssocGrpGRES"
