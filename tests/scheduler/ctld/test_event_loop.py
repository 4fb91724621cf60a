"""The controller's event loop never takes the replica's lock (the Raft thread needs it to
apply each entry; a loop waiting for it stalls every request). `StateLock` refuses to be
taken on a thread that runs an event loop, and every route of the API is called here on
a real controller (a lone replica, in this process) through its ASGI app: a route that
read the state on the loop would raise instead of answering."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from scheduler import config as spur_config
from scheduler.client import JobReport
from scheduler.ctld.api import build_app
from scheduler.ctld.controller import Controller
from scheduler.ctld.replica import LockOnEventLoop, StateLock
from scheduler.rpc import signatures
from tests.fixtures.controller import write_controller_config
from tests.fixtures.processes import free_port, wait_until
from tests.scheduler.core.factories import gpu_node, spec

TOKEN = "event-loop-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_the_lock_refuses_an_event_loop_thread_and_serves_any_other() -> None:
    lock = StateLock()

    async def on_the_loop() -> None:
        with lock:
            pass

    with pytest.raises(LockOnEventLoop):
        asyncio.run(on_the_loop())
    taken = []

    def on_a_thread() -> None:
        with lock, lock:  # re-entrant
            taken.append(True)

    thread = threading.Thread(target=on_a_thread)
    thread.start()
    thread.join()
    assert taken == [True]


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    path = tmp_path / "spur.toml"
    write_controller_config(
        path,
        token=TOKEN,
        http_port=free_port(),
        raft_port=free_port(),
        state_dir=tmp_path / "ctld",
        broker_url="filesystem://",
        broker_folder=tmp_path / "broker",
    )
    ctl = Controller(spur_config.load(path, env={}))
    ctl.start()
    try:
        assert ctl.wait_ready(30)
        wait_until(lambda: ctl.replica.is_leader and ctl.partitions(), timeout=30, what="leader")
        yield ctl
    finally:
        ctl.stop()


def test_every_route_answers_without_taking_the_lock_on_the_event_loop(
    controller: Controller,
) -> None:
    app = build_app(controller, TOKEN)
    called: set[tuple[str, str]] = set()
    with TestClient(app, raise_server_exceptions=True) as http:

        def call(method: str, path: str, route: str, **kw: Any) -> Any:
            headers = kw.pop("headers", AUTH)
            answer = http.request(method, path, headers=headers, **kw)
            assert answer.status_code < 500, (method, path, answer.text)
            called.add((method, route))
            return answer.json() if answer.headers.get("content-type", "").endswith("json") else {}

        node = gpu_node("n1").to_dict()
        credential = call("POST", "/v1/nodes/register", "/v1/nodes/register", json=node)
        assert credential["credential"]
        call("POST", "/v1/nodes/n1/heartbeat", "/v1/nodes/{node}/heartbeat", json={"running": []})
        submitted = call("POST", "/v1/jobs", "/v1/jobs", json={"spec": spec().to_dict()})
        job_id = submitted["job_id"]
        # The answer is the job as the apply left it, with its spec.
        assert submitted["job"]["job_id"] == job_id and submitted["job"]["spec"]["tenant"] == "acme"
        batch = call(
            "POST",
            "/v1/jobs/batch",
            "/v1/jobs/batch",
            json={"jobs": [{"spec": spec(hold=True).to_dict()} for _ in range(2)]},
        )
        held = batch["results"][0]["job_id"]
        assert batch["results"][1]["job"]["reason"] == "JobHeldUser"
        wait_until(
            lambda: controller.job(job_id)["state"] == "RUNNING",  # type: ignore[index]
            timeout=30,
            what="job running",
        )
        assert call("GET", "/v1/jobs", "/v1/jobs", params={"states": "RUNNING"})["jobs"]
        call("GET", f"/v1/jobs/{job_id}", "/v1/jobs/{job_id:int}", params={"tenant": "acme"})
        call(
            "PATCH",
            f"/v1/jobs/{held}",
            "/v1/jobs/{job_id:int}",
            json={"changes": {"comment": "x"}, "tenant": "acme"},
        )
        call("POST", f"/v1/jobs/{held}/release", "/v1/jobs/{job_id:int}/{action:str}", json={})
        attempt = controller.job(job_id)["attempt"]  # type: ignore[index]
        started = JobReport("started", job_id, attempt, "n1", pid=4242)
        call("POST", f"/v1/jobs/{job_id}/started", "/v1/jobs/{job_id:int}/started",
             json=started.body())  # fmt: skip
        # The steps: the web's (cluster token) and srun's (the job's step credential).
        step = {"argv": ["true"], "ntasks": 1}
        created = call(
            "POST",
            f"/v1/jobs/{job_id}/steps/create",
            "/v1/jobs/{job_id:int}/steps/create",
            json={"tenant": "acme", "step": step},
        )
        step_id = created["step_id"]
        call(
            "POST",
            f"/v1/jobs/{job_id}/steps/{step_id}/end",
            "/v1/jobs/{job_id:int}/steps/{step_id}/end",
            json={"tenant": "acme", "exit_code": 0},
        )
        key = signatures.node_key(controller.signing_key, "n1")
        srun = {"Authorization": f"Bearer {signatures.step_token(key, 'n1', job_id, attempt)}"}
        own = call("POST", f"/v1/jobs/{job_id}/steps", "/v1/jobs/{job_id}/steps", json=step,
                   headers=srun)  # fmt: skip
        call(
            "POST",
            f"/v1/jobs/{job_id}/steps/{own['step_id']}/finished",
            "/v1/jobs/{job_id}/steps/{step_id}/finished",
            json={"exit_code": 0},
            headers=srun,
        )
        call(
            "POST",
            f"/v1/jobs/{job_id}/steps/{step_id}/cancel",
            "/v1/jobs/{job_id:int}/steps/{step_id}/cancel",
            json={"tenant": "acme"},
        )
        for kind in ("terminal", "service"):
            token = call(
                "POST",
                f"/v1/jobs/{job_id}/{kind}/token",
                f"/v1/jobs/{{job_id:int}}/{kind}/token",
                json={"tenant": "acme", "user": "alice"},
            )
            assert token["node"] == "n1"
        finished = JobReport("finished", job_id, attempt, "n1", exit_code=0)
        call("POST", f"/v1/jobs/{job_id}/finished", "/v1/jobs/{job_id:int}/finished",
             json=finished.body())  # fmt: skip
        results = call(
            "POST",
            "/v1/reports",
            "/v1/reports",
            json={"reports": [finished.to_dict(), {"kind": "started"}]},
        )["results"]
        assert results[0] == {"ok": True} and results[1]["error"]["status"] == 400
        call("GET", "/v1/nodes", "/v1/nodes")
        call("POST", "/v1/nodes/n1/drain", "/v1/nodes/{node}/drain", json={"reason": "fan"})
        call("POST", "/v1/nodes/n1/resume", "/v1/nodes/{node}/resume", json={})
        call("GET", "/v1/partitions", "/v1/partitions")
        call("GET", "/v1/policy", "/v1/policy")
        call("GET", "/v1/ping", "/v1/ping")
        call("GET", "/v1/raft", "/v1/raft")
        # A lone replica has no Raft port: both are refused (409), off the loop.
        call("POST", "/v1/raft/members", "/v1/raft/members", json={"address": "127.0.0.1:9"})
        call("DELETE", "/v1/raft/members/127.0.0.1:9", "/v1/raft/members/{address:str}")
        call("GET", "/metrics", "/metrics")
    routes = {
        (method, route.path)
        for route in app.router.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert routes - called == set()  # a new route gets called here too
