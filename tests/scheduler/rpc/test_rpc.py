"""The RPC kit: the server half (token, bounded bodies, errors to statuses) and the client
half (failover, retries, statuses back to the same errors), against each other."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.rpc import server as rpc
from scheduler.rpc.client import UNREACHABLE, Answer, RpcClient
from scheduler.rpc.errors import Conflict, NotFound, Refused, Unauthorized, Unavailable
from scheduler.rpc.server import Call, RpcRoute
from tests.fixtures.served import served_in_thread

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


@pytest.fixture(scope="module")
def listening() -> Iterator[str]:
    """The same app, served over HTTP by uvicorn in a thread: the client's real wire."""
    with served_in_thread(app()) as url:
        yield url


def client_of(url: str, **kw: Any) -> RpcClient:
    return RpcClient([url], TOKEN, **kw)


def replicas(handler: Any) -> Any:
    """A stand-in for the network (what the client sends through): `handler(host)`
    answers (status, JSON body) or raises as an unreachable host does."""

    def send(
        method: str, url: str, body: bytes | None, headers: Mapping[str, str], timeout: Any
    ) -> Answer:
        host = url.split("//", 1)[1].split("/", 1)[0]
        status, content = handler(host)
        raw = content if isinstance(content, bytes) else json.dumps(content).encode()
        return Answer(status, raw, url)

    return send


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
    listening: str, kind: str, error: type[Exception]
) -> None:
    with client_of(listening) as client, pytest.raises(error):
        client.call("GET", f"/fail/{kind}")


def test_the_client_sends_the_token_and_reads_the_answer(listening: str) -> None:
    with client_of(listening) as client:
        assert client.call("POST", "/echo", json={"n": 2}) == {"n": 2, "word": ""}
        assert client.call("POST", "/created") == {"ok": True}
        assert client.call_bytes("POST", "/echo", json={"n": 3, "word": "é"}) == (
            '{"n":3,"word":"é"}'.encode()
        )
    forged = RpcClient([listening], "forged")
    with forged, pytest.raises(Unauthorized):
        forged.call("POST", "/echo", json={"n": 2})


def test_it_fails_over_to_a_replica_that_answers_and_stays_there() -> None:
    seen: list[str] = []

    def handler(host: str) -> tuple[int, Any]:
        seen.append(host)
        if host == "down":
            raise ConnectionRefusedError("refused")
        if host == "follower":
            return 503, {"detail": "no leader", "code": "unavailable"}
        return 200, {"ok": True}

    urls = ["http://down", "http://follower", "http://leader"]
    with RpcClient(urls, TOKEN, transport=replicas(handler)) as client:
        assert client.call("GET", "/x") == {"ok": True}
        assert client.call("GET", "/x") == {"ok": True}
    assert seen == ["down", "follower", "leader", "leader"]


def test_no_answer_anywhere_is_unavailable_saying_so() -> None:
    def handler(host: str) -> tuple[int, Any]:
        raise ConnectionRefusedError("refused")

    client = RpcClient(["http://a", "http://b"], TOKEN, transport=replicas(handler))
    with client, pytest.raises(Unavailable) as caught:
        client.call("GET", "/x")
    assert caught.value.code == UNREACHABLE


def test_it_retries_while_unavailable_within_its_window() -> None:
    answers = iter([503, 503, 200])

    def handler(host: str) -> tuple[int, Any]:
        status = next(answers)
        return status, {"detail": "electing"} if status == 503 else {"n": 1}

    with RpcClient(["http://a"], TOKEN, transport=replicas(handler), retry_for_s=5.0) as client:
        assert client.call("GET", "/x") == {"n": 1}


def test_refusals_are_never_retried() -> None:
    calls: list[int] = []

    def handler(host: str) -> tuple[int, Any]:
        calls.append(1)
        return 400, {"detail": "no"}

    client = RpcClient(["http://a"], TOKEN, transport=replicas(handler), retry_for_s=5.0)
    with client, pytest.raises(Refused, match="no"):
        client.call("GET", "/x")
    assert calls == [1]


def test_an_answer_that_is_not_json_is_unavailable() -> None:
    client = RpcClient(["http://a"], TOKEN, transport=replicas(lambda host: (200, b"<html>")))
    with client, pytest.raises(Unavailable, match="not JSON"):
        client.call("GET", "/x")


def test_error_bodies_have_one_shape() -> None:
    assert json.loads(json.dumps(Conflict("x", code="c").body())) == {"detail": "x", "code": "c"}


class Counting(http.server.BaseHTTPRequestHandler):
    """Answers `{"peer": its connection's port}`, keeping the connection alive unless the
    path is /close; the server counts the connections it accepted."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = json.dumps({"peer": self.client_address[1], "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def counting() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url_of(server: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_calls_go_over_one_kept_connection(counting: http.server.ThreadingHTTPServer) -> None:
    with RpcClient([url_of(counting)], TOKEN) as client:
        peers = {client.call("GET", "/x", params={"a": "1 2"})["peer"] for _ in range(5)}
        assert client.call("GET", "/x", params=[("b", "c"), ("b", "d")])["path"] == "/x?b=c&b=d"
    assert len(peers) == 1


def test_a_connection_the_server_closed_is_replaced_and_the_call_answered(
    counting: http.server.ThreadingHTTPServer,
) -> None:
    with RpcClient([url_of(counting)], TOKEN) as client:
        first = client.call("GET", "/close")["peer"]  # the server closes it after answering
        second = client.call("GET", "/x")["peer"]
        assert second != first
        # Closed behind the client's back while idle: the next call still gets its answer.
        connections = client._connections
        for conns in connections._idle.values():
            for conn in conns:
                assert conn._sock is not None
                conn._sock.shutdown(socket.SHUT_RDWR)
        assert client.call("GET", "/x")["path"] == "/x"


def test_an_address_nobody_listens_on_is_unreachable() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    client = RpcClient([f"http://127.0.0.1:{port}"], TOKEN, timeout=2)
    with client, pytest.raises(Unavailable) as caught:
        client.call("GET", "/x")
    assert caught.value.code == UNREACHABLE


def test_a_server_that_does_not_answer_in_time_is_unavailable() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection, never answers
    client = RpcClient([f"http://127.0.0.1:{silent.getsockname()[1]}"], TOKEN, timeout=0.2)
    with client, pytest.raises(Unavailable) as caught:
        client.call("GET", "/x")
    assert caught.value.code == UNREACHABLE
    patient = RpcClient([f"http://127.0.0.1:{silent.getsockname()[1]}"], TOKEN, timeout=60)
    with patient, pytest.raises(Unavailable):
        patient.call("GET", "/x", timeout=0.2)  # this call's own, not the client's minute
    silent.close()
