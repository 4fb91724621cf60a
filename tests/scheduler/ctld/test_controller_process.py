"""The controller as a real process: RPC, auth, Raft journal across restarts."""

from __future__ import annotations

import signal
import subprocess

import httpx
import orjson
import pytest

from scheduler.client import ControllerClient, JobReport
from scheduler.core.contract import JobAction
from scheduler.rpc.errors import NotFound, Refused
from scheduler.rpc.signatures import registration_proof
from tests.fixtures.processes import BIN
from tests.scheduler.core.factories import gpu_node, spec


def register(client: ControllerClient, name: str = "sim01", **kw) -> None:
    client.register_node(gpu_node(name, **kw).to_dict())


def test_it_refuses_a_missing_or_forged_cluster_token(controller):
    for headers in ({}, {"Authorization": "Bearer forged"}, {"Authorization": controller.token}):
        answer = httpx.get(f"{controller.url}/v1/jobs", headers=headers)
        assert answer.status_code == 401
        assert answer.json()["detail"] == "missing or invalid cluster token"


def test_a_submitted_job_is_placed_on_exact_gpus(controller):
    with controller.client() as client:
        register(client)
        job_id = client.submit(spec(gpus_per_node=2).to_dict())["job_id"]
        job = client.job(job_id)
        assert job["spec"]["gpus_per_node"] == 2
        # The leader schedules right after the submit commits.
        import time

        deadline = time.monotonic() + 10
        while client.job(job_id)["state"] != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.05)
        job = client.job(job_id)
        assert job["state"] == "RUNNING"
        assert job["allocation"] == {
            "sim01": {"gpus": [0, 1], "cpus": 1, "mem_mb": 8192, "cpu_ids": [0]}
        }
        assert [n["gpus_alloc"] for n in client.nodes()] == [2]


def test_an_impossible_request_is_refused_with_a_clear_message(controller):
    with controller.client() as client:
        register(client)
        with pytest.raises(Refused) as err:
            client.submit(spec(gpus_per_node=9).to_dict())["job_id"]
        assert "Requested node configuration is not available" in err.value.message
        with pytest.raises(Refused, match="unknown GPU type 'h100'"):
            client.submit(spec(gpus_per_node=1, gpu_type="h100").to_dict())["job_id"]
        with pytest.raises(Refused, match="unknown job field"):
            client.submit({"script": "#!/bin/sh\n", "gpus_per_nod": 1})
        assert client.jobs() == []


def test_jobs_are_filtered_by_tenant(controller):
    with controller.client() as client:
        register(client)
        mine = client.submit(spec(tenant="acme").to_dict())["job_id"]
        client.submit(spec(tenant="other").to_dict())["job_id"]
        assert [j["job_id"] for j in client.jobs(tenant="acme")] == [mine]
        with pytest.raises(NotFound):
            client.job(mine, tenant="other")
        with pytest.raises(NotFound):
            client.act(mine, JobAction.CANCEL, tenant="other")
        assert client.job(mine)["state"] != "CANCELLED"


def test_a_retried_submission_with_the_same_key_is_one_job(controller):
    with controller.client() as client:
        register(client)
        first = client.submit(spec().to_dict(), idempotency_key="k-1")["job_id"]
        again = client.submit(spec().to_dict(), idempotency_key="k-1")["job_id"]
        assert first == again
        assert len(client.jobs()) == 1


def test_cancelling_a_pending_job_ends_it(controller):
    with controller.client() as client:
        register(client, gpus=1)
        client.submit(spec(gpus_per_node=1).to_dict())["job_id"]
        waiting = client.submit(spec(gpus_per_node=1).to_dict())["job_id"]
        job = client.act(waiting, JobAction.CANCEL, by="alice")
        assert job["state"] == "CANCELLED"
        assert job["cancelled_by"] == "alice"


def test_restarting_keeps_every_acknowledged_job(controller):
    with controller.client() as client:
        register(client)
        ids = [client.submit(spec(name=f"job{i}").to_dict())["job_id"] for i in range(20)]
    controller.stop(signal.SIGKILL)  # no clean shutdown: only the journal survives
    controller.start()
    with controller.client() as client:
        jobs = {j["job_id"]: j for j in client.jobs()}
        assert sorted(jobs) == ids
        assert [jobs[i]["name"] for i in ids] == [f"job{i}" for i in range(20)]
        assert client.submit(spec().to_dict())["job_id"] == ids[-1] + 1


def test_a_heartbeat_names_processes_the_cluster_does_not_know(controller):
    with controller.client() as client:
        register(client)
        answer = client.heartbeat("sim01", [{"job_id": 4242, "attempt": 1}])
        assert answer["kill"] == [{"job_id": 4242, "attempt": 1}]


def test_a_malformed_report_is_a_clear_400(controller):
    answer = httpx.post(
        f"{controller.url}/v1/jobs/1/finished",
        headers={"Authorization": f"Bearer {controller.token}"},
        json={"attempt": "one"},
    )
    assert answer.status_code == 400
    assert answer.json()["detail"] == "attempt must be an integer"


def test_a_pending_job_shows_its_priority_and_each_factor(controller):
    with controller.client() as client:
        register(client, gpus=1)
        client.submit(spec(gpus_per_node=1).to_dict())["job_id"]
        waiting = client.submit(spec(gpus_per_node=1, nice=50).to_dict())["job_id"]
        import time

        deadline = time.monotonic() + 10
        # The pass publishes the factors, then commits the reasons: wait for both.
        while time.monotonic() < deadline:
            job = client.job(waiting)
            if "priority_factors" in job and job["reason"] == "Resources":
                break
            time.sleep(0.05)
        job = client.job(waiting)
        assert job["state"] == "PENDING" and job["reason"] == "Resources"
        factors = job["priority_factors"]
        assert set(factors) >= {"age", "fairshare", "qos", "partition", "size", "nice"}
        assert factors["nice"] == 50 and job["priority"] == factors["priority"]


def test_a_held_job_waits_until_released_and_a_requeue_puts_it_back(controller):
    import time

    def settle(client, job_id, state, reason=None):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            job = client.job(job_id)
            if job["state"] == state and (reason is None or job["reason"] == reason):
                return job
            time.sleep(0.05)
        raise AssertionError(client.job(job_id))

    with controller.client() as client:
        register(client)
        held = client.submit(spec(hold=True).to_dict())["job_id"]
        settle(client, held, "PENDING", "JobHeldUser")
        with pytest.raises(NotFound):
            client.act(held, JobAction.RELEASE, tenant="other")
        client.act(held, JobAction.RELEASE, tenant="acme")
        settle(client, held, "RUNNING")
        client.act(held, JobAction.REQUEUEHOLD)
        client.report(JobReport("finished", held, 1, "sim01", exit_code=0, signal=15))
        settle(client, held, "PENDING", "JobHeldUser")
        with pytest.raises(NotFound, match="unknown job action"):
            client.call("POST", f"/v1/jobs/{held}/explode", json={})


def test_a_node_gets_its_credential_once_and_must_prove_it_after(controller):
    with controller.client() as client:
        first = client.register_node(gpu_node("sim01").to_dict())
        credential = bytes.fromhex(first["credential"])
        with pytest.raises(Refused) as refused:  # someone else claiming the name
            client.register_node(gpu_node("sim01").to_dict())
        assert refused.value.status == 403
        proof = registration_proof(credential, "sim01")
        again = client.register_node(gpu_node("sim01").to_dict(), proof=proof)
        assert again["credential"] == first["credential"]
    printed = subprocess.run(
        [str(BIN / "spurctld"), "--config", str(controller.config_path), "--print-credential",
         "sim01"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert printed.stdout.strip() == first["credential"]
    key_file = controller.state_dir / "signing-key"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_the_job_list_filters_and_cuts_on_the_controller(controller):
    """What squeue asks for is chosen where the jobs are: only matching rows, only the
    fields asked for, travel. A name may hold a comma; an array's id names its tasks."""
    with controller.client() as client:
        register(client)
        first = client.submit(spec(name="a,b", hold=True).to_dict())["job_id"]
        client.submit(spec(name="other", user="bob", hold=True).to_dict())
        array = client.submit(spec(name="arr", hold=True, array="0-2").to_dict())["job_id"]
        client.submit(spec(name="a,b", tenant="globex", hold=True).to_dict())

        def ids(**filters) -> list[int]:
            return [job["job_id"] for job in client.jobs(tenant="acme", **filters)]

        assert ids(names=["a,b"]) == [first]
        assert ids(users=["bob"], names=["a,b"]) == []
        assert ids(users=["alice", "bob"]) == ids() and len(ids()) == 5
        assert ids(ids=[array]) == [array, array + 1, array + 2]  # the array's tasks
        assert ids(ids=[array + 1, first, 999_999]) == [first, array + 1]  # one task; none
        globex = client.jobs(tenant="globex")[0]["job_id"]
        assert ids(ids=[globex]) == [] and globex == array + 3  # another tenant's job
        assert ids(accounts=["nobody"]) == [] and ids(partitions=["gpu"]) == ids()
        cut = client.jobs(tenant="acme", names=["arr"], fields=["state", "array_task_id"])
        assert cut == [
            {"job_id": array + i, "state": "PENDING", "array_task_id": i} for i in range(3)
        ]
        client.act(first, JobAction.CANCEL)
        ended = client.job(first)["end_time"]
        assert first in ids(ended_after=ended) and first not in ids(ended_after=ended + 1)
        with pytest.raises(Refused, match="unknown job field"):
            client.jobs(fields=["state", "script"])
        with pytest.raises(Refused, match="not a time"):
            client.call("GET", "/v1/jobs", params={"ended_after": "nan"})
        # The same list as columns (what the web passes on to squeue): a list per field,
        # times as whole epoch seconds.
        # (Built a field at a time from the jobs, the priority as the last pass ranked it;
        # the dependency and spec as the job dict says them.)
        asked = ["state", "submit_time", "end_time", "nodes", "held", "priority", "dependency"]
        asked += ["spec", "priority_factors"]
        whole = client.jobs(tenant="acme", fields=asked)
        columns = orjson.loads(client.job_columns(tenant="acme", fields=asked))
        assert columns["n"] == len(whole) == 5
        assert set(columns["columns"]) == {"job_id", *asked}
        assert columns["columns"]["job_id"] == [job["job_id"] for job in whole]
        for name in ("state", "nodes", "held", "priority", "dependency", "spec"):
            assert columns["columns"][name] == [job[name] for job in whole], name
        assert columns["columns"]["priority_factors"] == [
            job.get("priority_factors") for job in whole
        ]
        for name in ("submit_time", "end_time"):
            assert columns["columns"][name] == [
                None if job[name] is None else int(job[name]) for job in whole
            ]
        with pytest.raises(Refused, match="columns need fields"):
            client.call("GET", "/v1/jobs", params={"shape": "columns"})


def test_a_job_waiting_for_resources_shows_when_and_where_it_is_expected_to_start(controller):
    import time

    with controller.client() as client:
        register(client, gpus=1)
        busy = client.submit(spec(gpus_per_node=1, time_limit_min=10).to_dict())["job_id"]
        waiting = client.submit(spec(gpus_per_node=1, time_limit_min=5).to_dict())["job_id"]
        held = client.submit(spec(gpus_per_node=1, hold=True).to_dict())["job_id"]
        # The leader estimates starts every few seconds (reads.START_ESTIMATE_INTERVAL_S).
        deadline = time.monotonic() + 30
        while client.job(waiting).get("expected_start") is None:
            assert time.monotonic() < deadline, "no start estimate came"
            time.sleep(0.1)
        started = client.job(busy)["start_time"]
        job = client.job(waiting)
        assert (job["state"], job["reason"]) == ("PENDING", "Resources")
        assert job["expected_start"] == started + 600  # when the one ahead runs out
        assert job["sched_nodes"] == ["sim01"]
        assert (client.job(held)["expected_start"], client.job(held)["sched_nodes"]) == (None, [])
        assert client.job(busy)["expected_start"] is None  # it started: nothing to expect
        # The list and its columns (what squeue reads) say the same.
        asked = ["expected_start", "sched_nodes"]
        rows = {j["job_id"]: j for j in client.jobs(fields=asked)}
        assert rows[waiting] == {"job_id": waiting, **{k: job[k] for k in asked}}
        columns = orjson.loads(client.job_columns(fields=asked))["columns"]
        assert columns["job_id"] == [busy, waiting, held]
        assert columns["expected_start"] == [None, int(started + 600), None]
        assert columns["sched_nodes"] == [[], ["sim01"], []]
