"""GET /api/v1/jobs/{id}/output: a job's stdout or stderr, read from the agent of the
job's first node, which the controller knows. Against a real controller, and a small
real HTTP server in the test that answers the agent's route."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from django.test import Client
from rest_framework.test import APIClient

from spurcloud.jobs.services import record_job_event
from tests.fixtures.processes import free_port
from tests.spurcloud.conftest import Tenant, event, job_dict

JOB = 41
OUTPUT = "epoch 1 loss 0.9\nepoch 2 loss 0.5\n"


@dataclass
class FakeAgent:
    """The agent's `GET /v1/jobs/{id}/output`, for the jobs it ran (others: 404)."""

    token: str
    outputs: dict[int, dict[str, str]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def answer(self, path: str, headers: Any) -> tuple[int, dict[str, Any]]:
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"detail": "bad cluster token", "code": "unauthorized"}
        parsed = urlparse(path)
        match = re.fullmatch(r"/v1/jobs/([0-9]+)/output", parsed.path)
        if match is None:
            return 404, {"detail": "no such route", "code": "not_found"}
        job_id = int(match.group(1))
        query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
        self.requests.append({"job_id": job_id, **query})
        if job_id not in self.outputs:
            return 404, {"detail": f"job {job_id} never ran here", "code": "not_found"}
        stream = query.get("stream", "stdout")
        offset, limit = int(query.get("offset", 0)), int(query.get("limit", 65536))
        text = self.outputs[job_id][stream]
        data = text.encode()[offset : offset + limit].decode()
        return 200, {
            "job_id": job_id,
            "attempt": 1,
            "stream": stream,
            "offset": offset,
            "next_offset": offset + len(data.encode()),
            "size": len(text.encode()),
            "data": data,
            "running": True,
        }


@pytest.fixture
def agent(live_controller: Any) -> Iterator[FakeAgent]:
    """A fake agent on loopback, registered with the controller as node02."""
    fake = FakeAgent(token=live_controller.token)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = fake.answer(self.path, self.headers)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    _register(live_controller, "node02", fake.url)
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def _register(controller: Any, name: str, agent_url: str) -> None:
    client = controller.client()
    try:
        client.register_node({"name": name, "cpus": 8, "memory_mb": 8000, "agent_url": agent_url})
    finally:
        client.close()


def _job(job_id: int = JOB, *, tenant: str = "acme", nodes: list[str] | None = None) -> None:
    nodes = ["node02"] if nodes is None else nodes
    state = "RUNNING" if nodes else "PENDING"
    record_job_event(
        event=event(
            job_dict(job_id, tenant=tenant, user="max", state=state, nodes=nodes, attempt=1)
        )
    )


def _output(client: APIClient, job_id: int = JOB, **query: Any) -> Any:
    return client.get(f"/api/v1/jobs/{job_id}/output", query)


@pytest.mark.parametrize("who", ["as_owner", "as_member"])
def test_members_read_their_organisations_job_output(
    who: str, agent: FakeAgent, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    agent.outputs[JOB] = {"stdout": OUTPUT, "stderr": "warning: slow\n"}
    _job()
    response = _output(client)
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "job_id": JOB,
        "attempt": 1,
        "stream": "stdout",
        "offset": 0,
        "next_offset": len(OUTPUT),
        "size": len(OUTPUT),
        "data": OUTPUT,
        "running": True,
    }
    assert agent.requests == [{"job_id": JOB, "stream": "stdout", "offset": "0", "limit": "65536"}]


def test_a_chunk_of_stderr_from_an_offset(agent: FakeAgent, as_member: APIClient) -> None:
    agent.outputs[JOB] = {"stdout": OUTPUT, "stderr": "warning: slow\n"}
    _job()
    body = _output(as_member, stream="stderr", offset=9, limit=4).json()
    assert (body["stream"], body["data"], body["next_offset"]) == ("stderr", "slow", 13)
    assert agent.requests[-1] == {"job_id": JOB, "stream": "stderr", "offset": "9", "limit": "4"}


def test_an_outsider_gets_the_same_404_as_for_a_missing_job(
    agent: FakeAgent, as_outsider: APIClient
) -> None:
    agent.outputs[JOB] = {"stdout": OUTPUT, "stderr": ""}
    _job()
    response = _output(as_outsider)
    assert response.status_code == 404
    assert response.json() == {"detail": f"Job {JOB} not found.", "code": "not_found"}
    assert _output(as_outsider, job_id=999).json()["detail"] == "Job 999 not found."
    assert agent.requests == []  # the agent was never asked


def test_a_job_that_has_not_started_has_no_output_yet(acme: Tenant, as_member: APIClient) -> None:
    _job(nodes=[])
    response = _output(as_member)
    assert response.status_code == 404
    assert response.json()["detail"] == f"Job {JOB} has not started: there is no output yet."


def test_a_job_its_agent_never_ran_is_404(agent: FakeAgent, as_member: APIClient) -> None:
    _job()
    response = _output(as_member)
    assert response.status_code == 404
    assert response.json()["detail"] == f"Node node02 has no output of job {JOB}."


def test_an_unreachable_agent_is_503(live_controller: Any, as_member: APIClient) -> None:
    _register(live_controller, "node03", f"http://127.0.0.1:{free_port()}")
    _job(nodes=["node03"])
    response = _output(as_member)
    assert response.status_code == 503
    assert response.json()["detail"].startswith(f"Node node03, where job {JOB} ran, is unreachable")


def test_an_unreachable_controller_is_503(
    acme: Tenant, settings: Any, as_member: APIClient
) -> None:
    settings.SPUR_CONTROLLER_URLS = [f"http://127.0.0.1:{free_port()}"]
    _job()
    response = _output(as_member)
    assert response.status_code == 503
    assert response.json()["detail"].startswith("The scheduler is unreachable")


@pytest.mark.parametrize(
    "query",
    [{"stream": "stdin"}, {"offset": "-1"}, {"limit": "0"}, {"limit": str(2**40)}, {"tail": "1"}],
)
def test_a_malformed_output_query_is_400(
    query: dict[str, str], acme: Tenant, as_member: APIClient
) -> None:
    _job()
    response = _output(as_member, **query)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"


def test_the_schema_documents_every_answer_of_the_output_operation(db: None) -> None:
    schema = Client().get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/jobs/{job_id}/output"]["get"]
    assert operation["operationId"] == "jobs_output"
    assert set(operation["responses"]) == {"200", "400", "401", "403", "404", "429", "503"}
    assert {p["name"] for p in operation["parameters"]} >= {"stream", "offset", "limit"}
    body = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    component = schema["components"]["schemas"][body.rsplit("/", 1)[-1]]
    assert set(component["properties"]) == {
        "job_id", "attempt", "stream", "offset", "next_offset", "size", "data", "running"
    }  # fmt: skip
