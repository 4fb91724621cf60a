"""The web API client: token, pages, errors and kept-alive connections, against a real
HTTP server on loopback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from scheduler.cli.api import ApiClient
from scheduler.cli.config import CliConfig
from scheduler.rpc.errors import NotFound, Refused, RpcError, Unauthorized, Unavailable


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    port: int  # the client's port: one per connection


# What the server answers: (status, body); bytes go out as they are, anything else as JSON.
Handler = Callable[[Seen], tuple[int, Any]]


@dataclass
class Server:
    url: str
    seen: list[Seen] = field(default_factory=list)
    handler: Handler = lambda seen: (200, {})
    close_after_each: bool = False


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server(url="")

    class Answer(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the web server does

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            seen = Seen(
                self.command,
                parts.path,
                parse_qs(parts.query),
                dict(self.headers.items()),
                json.loads(raw) if raw else None,
                self.client_address[1],
            )
            state.seen.append(seen)
            status, body = state.handler(seen)
            if status == 0:  # the body is the whole answer, as the test wrote it
                self.wfile.write(body)
                self.close_connection = True
                return
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if state.close_after_each:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve  # noqa: N815 - http.server's names

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def client_of(server: Server, handler: Handler) -> ApiClient:
    server.handler = handler
    return ApiClient(CliConfig(api_url=server.url, token="spur_t"))


def test_it_sends_the_bearer_token_and_follows_next_pages(server: Server) -> None:
    def handler(seen: Seen) -> tuple[int, Any]:
        if seen.query.get("page") == ["2"]:
            return 200, {"results": [{"job_id": 2}], "next": None}
        return 200, {"results": [{"job_id": 1}], "next": "/api/v1/jobs?page=2"}

    with client_of(server, handler) as client:
        assert client.list_jobs({"state": "RUNNING"}) == [{"job_id": 1}, {"job_id": 2}]
    assert all(s.headers["Authorization"] == "Bearer spur_t" for s in server.seen)
    assert server.seen[0].query["state"] == ["RUNNING"]
    assert (server.seen[1].path, server.seen[1].query) == ("/api/v1/jobs", {"page": ["2"]})
    # One connection, kept alive across the pages.
    assert len({s.port for s in server.seen}) == 1


def test_cancel_posts_the_signal_when_given(server: Server) -> None:
    client = client_of(server, lambda seen: (200, {"job_id": 5}))
    client.cancel_job(5)
    client.cancel_job(5, 12)
    client.close()
    assert [s.body for s in server.seen] == [{}, {"signal": 12}]
    assert {s.headers["Content-Type"] for s in server.seen} == {"application/json"}
    assert [s.path for s in server.seen] == ["/api/v1/jobs/5/cancel"] * 2


def test_a_server_that_closes_each_connection_is_reconnected(server: Server) -> None:
    server.close_after_each = True
    client = client_of(server, lambda seen: (200, {"job_id": 1}))
    for _ in range(3):
        assert client.get_job(1) == {"job_id": 1}
    assert len({s.port for s in server.seen}) == 3


@pytest.mark.parametrize(
    ("status", "error", "text"),
    [
        (400, Refused, "Requested node configuration is not available"),
        (401, Unauthorized, "authentication failed"),
        (404, NotFound, "Not found."),
        (429, Refused, "Not found."),
        (503, Unavailable, "the scheduler is unavailable"),
        (500, Unavailable, "answered 500"),
    ],
)
def test_http_errors_become_clear_exceptions(
    server: Server, status: int, error: type[RpcError], text: str
) -> None:
    detail = "Requested node configuration is not available" if status == 400 else "Not found."
    client = client_of(server, lambda seen: (status, {"detail": detail, "code": "why"}))
    with pytest.raises(error, match=text) as caught:
        client.get_job(1)
    assert caught.value.status == status
    assert caught.value.code == "why"


def test_an_error_that_is_not_json_says_what_came(server: Server) -> None:
    client = client_of(server, lambda seen: (502, b"<html>Bad Gateway</html>"))
    with pytest.raises(Unavailable, match="answered 502: <html>Bad Gateway</html>"):
        client.get_job(1)
    client = client_of(server, lambda seen: (200, b"<html>"))
    with pytest.raises(Unavailable, match="not JSON"):
        client.get_job(1)


def test_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ApiClient(CliConfig(api_url=f"http://127.0.0.1:{port}", token="t"))
    with pytest.raises(Unavailable, match=f"cannot reach the Spur API at http://127.0.0.1:{port}/"):
        client.queue()


@pytest.mark.parametrize("body", [[1, 2], {"results": "x"}, {"next": None}])
def test_a_malformed_list_answer_is_an_error(server: Server, body: object) -> None:
    with pytest.raises(RpcError, match="unexpected answer"):
        client_of(server, lambda seen: (200, body)).nodes()


def test_pages_that_loop_are_an_error(server: Server) -> None:
    client = client_of(server, lambda seen: (200, {"results": [], "next": "/api/v1/nodes"}))
    with pytest.raises(RpcError, match="loop"):
        client.nodes()


@pytest.mark.parametrize(
    "answer",
    [
        # chunked, with a chunk extension and a trailer
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'6;x=y\r\n{"job_\r\n8\r\nid": 7}\r\n0\r\nX-T: 1\r\n\r\n',
        # no length: the body ends with the connection
        b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"job_id": 7}',
        # an interim answer first
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 13\r\n"
        b'Connection: close\r\n\r\n{"job_id": 7}',
    ],
    ids=["chunked", "until-close", "interim"],
)
def test_the_answers_framing_is_read_as_http_says(server: Server, answer: bytes) -> None:
    client = client_of(server, lambda seen: (0, answer))
    assert client.get_job(7) == {"job_id": 7}
    assert client.get_job(7) == {"job_id": 7}  # on a new connection: the last one closed
    assert len({s.port for s in server.seen}) == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"",
        b"SSH-2.0-OpenSSH\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 70000 + b"\r\n\r\n",
    ],
    ids=["nothing", "not-http", "cut-short", "bad-length", "bad-chunk", "long-header"],
)
def test_a_broken_answer_is_unavailable_not_a_crash(server: Server, answer: bytes) -> None:
    client = client_of(server, lambda seen: (0, answer))
    with pytest.raises(Unavailable, match="cannot reach the Spur API"):
        client.get_job(7)
