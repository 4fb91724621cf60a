"""The RPC kit: the server half (token, bounded bodies, errors to statuses) and the client
half (failover, retries, statuses back to the same errors), against each other."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.rpc import server as rpc
from scheduler.rpc.client import UNREACHABLE, RpcClient
from scheduler.rpc.errors import Conflict, NotFound, Refused, Unauthorized, Unavailable
from scheduler.rpc.server import Call, RpcRoute

TOKEN = "t0ken"


def app(max_body: int = 1024) -> Any:
    async def echo(call: Call) -> Any:
        body = await call.body()
        rpc.only(body, {"n", "word"})
        return {"n": rpc.integer(body, "n", low=0, high=10), "word": rpc.text(body, "word")}

    async def fail(call: Call) -> Any:
        kind = call.path["kind"]
        if kind == "invalid":
            raise InvalidSpec("nodes must be at least 1", field="nodes")
        if kind in ("not_found", "not_running", "unavailable", "other", "permission"):
            raise Rejected(f"refused: {kind}", code=kind)
        if kind == "conflict":
            raise Conflict("not now")
        raise RuntimeError("a bug")

    async def created(call: Call) -> Any:
        return 201, {"ok": True}

    return rpc.rpc_app(
        [
            RpcRoute("/echo", echo, ("POST",)),
            RpcRoute("/fail/{kind}", fail),
            RpcRoute("/created", created, ("POST",)),
        ],
        token=TOKEN,
        max_body=max_body,
    )


@pytest.fixture
def served() -> TestClient:
    return TestClient(app(), raise_server_exceptions=False)


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_missing_or_forged_token_is_401_as_json(served: TestClient) -> None:
    for headers in ({}, auth("forged"), {"Authorization": TOKEN}):
        answer = served.post("/echo", json={"n": 1}, headers=headers)
        assert answer.status_code == 401
        assert answer.json() == {
            "detail": "missing or invalid cluster token",
            "code": "unauthorized",
        }


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        (b'{"n": 3, "word": "hi"}', 200, None),
        (b"", 400, "n must be an integer"),  # empty is {}
        (b"not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b"false", 400, "must be a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, 413, "larger than"),
        (b'{"n": 11}', 400, "n 11 is out of range"),
        (b'{"n": true}', 400, "n must be an integer"),
        (b'{"n": 1, "other": 2}', 400, "unknown field(s): other"),
    ],
)
def test_bodies_are_bounded_and_typed(
    served: TestClient, body: bytes, status: int, detail: str | None
) -> None:
    answer = served.post("/echo", content=body, headers=auth())
    assert answer.status_code == status, answer.text
    if detail is not None:
        assert detail in answer.json()["detail"]


def test_json_nested_beyond_the_parser_is_a_400_not_a_500() -> None:
    deep = b"[" * 50_000 + b"]" * 50_000
    served = TestClient(app(max_body=len(deep) + 1), raise_server_exceptions=False)
    answer = served.post("/echo", content=deep, headers=auth())
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["detail"]


def test_a_declared_length_over_the_bound_is_refused_before_reading(served: TestClient) -> None:
    answer = served.post("/echo", content=b"{}", headers={**auth(), "Content-Length": "99999"})
    assert answer.status_code == 413


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [
        ("invalid", 400, "invalid"),
        ("not_found", 404, "not_found"),
        ("not_running", 409, "not_running"),
        ("permission", 403, "permission"),
        ("unavailable", 503, "unavailable"),
        ("other", 400, "other"),
        ("conflict", 409, "conflict"),
        ("bug", 500, None),
    ],
)
def test_refusals_become_their_status(
    served: TestClient, kind: str, status: int, code: str
) -> None:
    answer = served.get(f"/fail/{kind}", headers=auth())
    assert answer.status_code == status
    if code is not None:
        assert answer.json()["code"] == code


def test_a_bug_is_a_plain_500_and_raised_for_the_server_to_log() -> None:
    raising = TestClient(app())
    with pytest.raises(RuntimeError, match="a bug"):
        raising.get("/fail/bug", headers=auth())
    answer = TestClient(app(), raise_server_exceptions=False).get("/fail/bug", headers=auth())
    assert (answer.status_code, answer.text) == (500, "Internal Server Error")


def routed_app() -> Any:
    """Our routes beside Starlette's own, as the controller and the agent mix them."""

    async def number(call: Call) -> Any:
        return {"n": call.path.get("n"), "q": call.query.get("q"), "h": call.headers.get("x-h")}

    async def plain(request: Request) -> Response:
        return PlainTextResponse(f"starlette {request.path_params.get('n', '')}")

    served = rpc.rpc_app(
        [
            RpcRoute("/n/{n:int}", number),
            RpcRoute("/taken", number),
            RpcRoute("/static", number, ("POST",)),
        ],
        token=TOKEN,
    )
    # Added afterwards, as build_app does: first, then last.
    served.router.routes[0:0] = [Route("/taken", plain)]
    served.router.routes.append(Route("/open", plain))
    return served


def test_our_routes_are_picked_as_starlette_picks_them() -> None:
    served = TestClient(routed_app(), raise_server_exceptions=False)
    answer = served.get("/n/42?q=x", headers={**auth(), "X-H": "y"})
    assert answer.json() == {"n": 42, "q": "x", "h": "y"}  # the path's int, converted
    for _ in range(2):  # the second time from the remembered route
        assert served.get("/taken", headers=auth()).text == "starlette "  # the route before
        assert served.get("/open").text == "starlette "
        assert served.get("/static", headers=auth()).status_code == 405  # another method
        assert served.post("/static", headers=auth()).json()["n"] is None
        assert served.get("/n/x", headers=auth()).status_code == 404  # not an int
        assert served.get("/nowhere", headers=auth()).status_code == 404
        assert served.post("/static").status_code == 401


def test_a_body_in_pieces_is_read_whole_and_bounded() -> None:
    served = TestClient(app(max_body=64), raise_server_exceptions=False)

    def pieces(*chunks: bytes) -> Any:
        yield from chunks

    answer = served.post(
        "/echo", content=pieces(b'{"n": ', b'3, "word"', b': "hi"}'), headers=auth()
    )
    assert answer.json() == {"n": 3, "word": "hi"}
    answer = served.post("/echo", content=pieces(b" " * 40, b" " * 40, b"{}"), headers=auth())
    assert answer.status_code == 413


def test_a_client_gone_while_its_body_is_read_is_starlettes_disconnect() -> None:
    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "headers": [], "path_params": {}, "query_string": b""}
    with pytest.raises(ClientDisconnect):
        asyncio.run(Call(scope, gone, 100).body())


def client_of(served: TestClient, **kw: Any) -> RpcClient:
    return RpcClient(["http://testserver"], TOKEN, transport=served._transport, **kw)


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("invalid", Refused),
        ("not_found", NotFound),
        ("not_running", Conflict),
        ("unavailable", Unavailable),
        ("bug", Unavailable),
    ],
)
def test_the_client_raises_what_the_server_raised(
    served: TestClient, kind: str, error: type[Exception]
) -> None:
    with client_of(served) as client, pytest.raises(error):
        client.call("GET", f"/fail/{kind}")


def test_the_client_sends_the_token_and_reads_the_answer(served: TestClient) -> None:
    with client_of(served) as client:
        assert client.call("POST", "/echo", json={"n": 2}) == {"n": 2, "word": ""}
        assert client.call("POST", "/created") == {"ok": True}
    forged = RpcClient(["http://testserver"], "forged", transport=served._transport)
    with forged, pytest.raises(Unauthorized):
        forged.call("POST", "/echo", json={"n": 2})


def test_it_fails_over_to_a_replica_that_answers_and_stays_there() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        if request.url.host == "follower":
            return httpx.Response(503, json={"detail": "no leader", "code": "unavailable"})
        return httpx.Response(200, json={"ok": True})

    urls = ["http://down", "http://follower", "http://leader"]
    with RpcClient(urls, TOKEN, transport=httpx.MockTransport(handler)) as client:
        assert client.call("GET", "/x") == {"ok": True}
        assert client.call("GET", "/x") == {"ok": True}
    assert seen == ["down", "follower", "leader", "leader"]


def test_no_answer_anywhere_is_unavailable_saying_so() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = RpcClient(["http://a", "http://b"], TOKEN, transport=httpx.MockTransport(handler))
    with client, pytest.raises(Unavailable) as caught:
        client.call("GET", "/x")
    assert caught.value.code == UNREACHABLE


def test_it_retries_while_unavailable_within_its_window() -> None:
    answers = iter([503, 503, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        return httpx.Response(status, json={"detail": "electing"} if status == 503 else {"n": 1})

    transport = httpx.MockTransport(handler)
    with RpcClient(["http://a"], TOKEN, transport=transport, retry_for_s=5.0) as client:
        assert client.call("GET", "/x") == {"n": 1}


def test_refusals_are_never_retried() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, json={"detail": "no"})

    transport = httpx.MockTransport(handler)
    client = RpcClient(["http://a"], TOKEN, transport=transport, retry_for_s=5.0)
    with client, pytest.raises(Refused, match="no"):
        client.call("GET", "/x")
    assert calls == [1]


def test_an_answer_that_is_not_json_is_unavailable() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>"))
    client = RpcClient(["http://a"], TOKEN, transport=transport)
    with client, pytest.raises(Unavailable, match="not JSON"):
        client.call("GET", "/x")


def test_error_bodies_have_one_shape() -> None:
    assert json.loads(json.dumps(Conflict("x", code="c").body())) == {"detail": "x", "code": "c"}
