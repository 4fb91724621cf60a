"""Partition and request rules at submit and in the pass: allowed accounts, required
nodes that are down, the API's GPU fraction."""

from __future__ import annotations

import pytest

from scheduler.core import commands as c
from scheduler.core.contract import JobSpec, JobState
from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.core.planner import plan
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node, submit


def test_a_partition_refuses_an_account_it_does_not_allow():
    parts = (c.PartitionDef(name="gpu", default=True, allow_accounts=("acme",)),)
    state = cluster(gpu_node("sim01"), partitions=parts)
    assert state.jobs[submit(state, tenant="acme")].partition == "gpu"
    with pytest.raises(Rejected, match="Job's account not permitted to use this partition"):
        submit(state, tenant="other")


def test_a_job_that_insists_on_a_down_node_waits_with_req_node_not_avail():
    state = cluster(gpu_node("sim01"), gpu_node("sim02"))
    state.apply(c.NodeLost(cmd_id(), 1001.0, "sim02"))
    job_id = submit(state, nodelist=("sim02",))
    allocate = plan(state, now=1002.0, cmd_id=cmd_id())
    assert allocate is not None
    state.apply(allocate)
    job = state.jobs[job_id]
    assert (job.state, job.reason) == (JobState.PENDING, "ReqNodeNotAvail")


def test_a_gpu_fraction_is_a_share_in_milli_gpus():
    spec = JobSpec.from_dict({"script": "#!/bin/sh\n", "gpu_fraction": 0.25})
    assert spec.gpu_milli == 250
    for bad in (0, 1, 1.5, "half", True):
        with pytest.raises(InvalidSpec, match="gpu_fraction"):
            JobSpec.from_dict({"script": "#!/bin/sh\n", "gpu_fraction": bad})
    with pytest.raises(InvalidSpec, match="not both"):
        JobSpec.from_dict({"script": "#!/bin/sh\n", "gpu_fraction": 0.5, "gpu_milli": 500})


def test_four_quarter_gpu_jobs_share_one_gpu():
    state = cluster(gpu_node("sim01"))
    ids = [submit(state, gpu_milli=250) for _ in range(4)]
    state.apply(plan(state, now=1002.0, cmd_id=cmd_id()))
    state.validate()
    gpus = {state.jobs[i].allocation["sim01"].gpus for i in ids}
    assert len(gpus) == 1  # packed onto one device, not spread over four
    assert state.nodes["sim01"].gpu_milli_used[next(iter(gpus))[0]] == 1000
