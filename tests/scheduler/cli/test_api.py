"""The web API client: token, pages, and errors."""

from __future__ import annotations

import json

import httpx
import pytest

from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig
from scheduler.rpc.errors import NotFound, Refused, RpcError, Unauthorized, Unavailable

CONFIG = CliConfig(api_url="http://api.test", token="spur_t")


def client_answering(status: int, body: object) -> ApiClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body)

    return ApiClient(CONFIG, transport=httpx.MockTransport(handler))


def test_it_sends_the_bearer_token_and_follows_next_pages() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.params.get("page") == "2":
            return httpx.Response(200, json={"results": [{"job_id": 2}], "next": None})
        return httpx.Response(200, json={"results": [{"job_id": 1}], "next": "/api/v1/jobs?page=2"})

    client = ApiClient(CONFIG, transport=httpx.MockTransport(handler))
    assert client.list_jobs({"state": "RUNNING"}) == [{"job_id": 1}, {"job_id": 2}]
    assert all(r.headers["Authorization"] == "Bearer spur_t" for r in seen)
    assert seen[0].url.params["state"] == "RUNNING"
    assert str(seen[1].url) == "http://api.test/api/v1/jobs?page=2"


def test_cancel_posts_the_signal_when_given() -> None:
    bodies: list[object] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"job_id": 5})

    client = ApiClient(CONFIG, transport=httpx.MockTransport(handler))
    client.cancel_job(5)
    client.cancel_job(5, 12)
    assert bodies == [{}, {"signal": 12}]


@pytest.mark.parametrize(
    ("status", "error", "text"),
    [
        (400, Refused, "Requested node configuration is not available"),
        (401, Unauthorized, "authentication failed"),
        (404, NotFound, "Not found."),
        (503, Unavailable, "the scheduler is unavailable"),
        (500, Unavailable, "answered 500"),
    ],
)
def test_http_errors_become_clear_exceptions(status: int, error: type[RpcError], text: str) -> None:
    detail = "Requested node configuration is not available" if status == 400 else "Not found."
    client = client_answering(status, {"detail": detail})
    with pytest.raises(error, match=text) as caught:
        client.get_job(1)
    assert caught.value.status == status


def test_an_unreachable_server_is_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = ApiClient(CONFIG, transport=httpx.MockTransport(handler))
    with pytest.raises(Unavailable, match="cannot reach the Spur API at http://api.test/"):
        client.queue()


@pytest.mark.parametrize("body", [[1, 2], {"results": "x"}, {"next": None}])
def test_a_malformed_list_answer_is_an_error(body: object) -> None:
    with pytest.raises(RpcError, match="unexpected answer"):
        client_answering(200, body).nodes()


def test_pages_that_loop_are_an_error() -> None:
    client = client_answering(200, {"results": [], "next": "/api/v1/nodes"})
    with pytest.raises(RpcError, match="loop"):
        client.nodes()
