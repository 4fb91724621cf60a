"""The kit's HTTP/1.1 wire (`scheduler.rpc.http`) under the services' client: framing,
kept connections, a server that closes or goes quiet, bounds and TLS, against real
sockets on loopback: a server that writes each answer as a test scripted it."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scheduler.rpc.client import UNREACHABLE, RpcClient
from scheduler.rpc.errors import Unavailable
from scheduler.rpc.http import Connection, ProtocolError, RemoteDisconnected

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{"n": 1}'
CLOSE = "close"  # the connection closed, after what came before it, with no answer
RESET = "reset"  # the connection reset (RST), with no answer
QUIET = "quiet"  # no answer, the connection left open


@dataclass
class Scripted:
    """Answers the requests it reads, in the order they come, with `answers`: bytes
    written as they are (then the connection closed if `closing` says so), or one of
    CLOSE, RESET, QUIET; OK once the script ran out. Records each request's connection
    (numbered from 1) and its head."""

    url: str = ""
    answers: list[bytes | str] = field(default_factory=list)
    closing: set[int] = field(default_factory=set)  # numbers of answers closed after
    requests: list[tuple[int, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    delay_s: float = 0.0

    @property
    def connections(self) -> list[int]:
        return [conn for conn, _ in self.requests]

    def serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                buffer = buffer[length:]
                with self.lock:
                    self.requests.append((number, head))
                    index = len(self.requests) - 1
                    answer = self.answers[index] if index < len(self.answers) else OK
                time.sleep(self.delay_s)
                if answer == CLOSE:
                    return
                if answer == RESET:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                    return
                if answer == QUIET:
                    time.sleep(5)
                    return
                assert isinstance(answer, bytes)
                conn.sendall(answer)
                if index in self.closing:
                    return


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    state = Scripted()
    listener = socket.create_server(("127.0.0.1", 0))
    state.url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    def accept() -> None:
        number = 0
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the test ended
            number += 1
            threading.Thread(target=state.serve, args=(conn, number), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield state
    listener.close()


def client_of(server: Scripted, **kw: float) -> RpcClient:
    return RpcClient([server.url], "t", **kw)


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        # chunked, with a chunk extension and a trailer
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
         b'3;x=y\r\n{"n\r\n5\r\n": 1}\r\n0\r\nX-T: 1\r\n\r\n', True),
        (b'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 8\r\n\r\n{"n": 1}', False),
        # no length: the body ends with the connection
        (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"n": 1}', False),
        (b'HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\n{"n": 1}', False),
        (b'HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 8\r\n\r\n{"n": 1}', True),
        # an interim answer first; header lines ended by a bare newline
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\nContent-Length: 8\n\n" b'{"n": 1}', True),
    ],
    ids=["chunked", "connection-close", "until-close", "http/1.0", "http/1.0-kept", "interim"],
)  # fmt: skip
def test_each_framing_is_read_whole_and_the_connection_kept_only_if_it_may_be(
    scripted: Scripted, answer: bytes, kept: bool
) -> None:
    scripted.answers = [answer]
    scripted.closing = {0} if not kept else set()
    with client_of(scripted) as client:
        assert client.call("GET", "/a") == {"n": 1}
        assert client.call("POST", "/b", json={"x": 1}) == {"n": 1}
    assert scripted.connections == ([1, 1] if kept else [1, 2])
    assert scripted.requests[1][1].startswith(b"POST /b HTTP/1.1\r\n")


def test_a_kept_connection_the_server_dropped_while_idle_is_replaced_once(
    scripted: Scripted,
) -> None:
    # The server closes the first connection after its answer without saying so, and
    # resets the second: each next call goes out again on a new connection, once.
    scripted.answers = [OK, OK]
    scripted.closing = {0}
    with client_of(scripted) as client:
        assert client.call("POST", "/a", json={}) == {"n": 1}
        time.sleep(0.05)  # its close reaches the client's side
        assert client.call("POST", "/b", json={}) == {"n": 1}
        assert scripted.connections == [1, 2]
        scripted.answers += [RESET, OK]
        assert client.call("GET", "/c") == {"n": 1}  # reset on 2, answered on 3
    assert scripted.connections == [1, 2, 2, 3]


def test_a_new_connection_that_fails_is_unavailable_not_tried_again(scripted: Scripted) -> None:
    scripted.answers = [OK, CLOSE, CLOSE]
    with client_of(scripted) as client:
        assert client.call("GET", "/a") == {"n": 1}
        with pytest.raises(Unavailable, match="closed the connection without answering") as caught:
            client.call("GET", "/b")  # the kept one closes, then the new one too
        assert caught.value.code == UNREACHABLE
        assert scripted.connections == [1, 1, 2]
        assert client.call("GET", "/c") == {"n": 1}
    assert scripted.connections == [1, 1, 2, 3]


def test_a_calls_timeout_is_its_own_and_a_quiet_connection_is_not_kept(
    scripted: Scripted,
) -> None:
    scripted.answers = [OK, QUIET]
    with client_of(scripted, timeout=60) as client:
        assert client.call("GET", "/a", timeout=5) == {"n": 1}
        started = time.monotonic()
        with pytest.raises(Unavailable, match="timed out"):
            client.call("GET", "/b", timeout=0.2)  # the kept connection goes quiet
        assert time.monotonic() - started < 5
        assert client.call("GET", "/c") == {"n": 1}  # on a new connection
    assert scripted.connections == [1, 1, 2]
    scripted.delay_s = 0.3  # slower than the client's own timeout, within the last call's
    with client_of(scripted, timeout=0.1) as client:
        assert client.call("GET", "/d", timeout=5) == {"n": 1}
        with pytest.raises(Unavailable, match="timed out"):
            client.call("GET", "/e")  # the client's timeout again, not the last call's


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n", "too many headers"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", "too long"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}", "mid-answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"X: 1\r\n" * 101,
            "too many trailers",
        ),
    ],
    ids=[
        "not-http",
        "too-many-headers",
        "long-header",
        "cut-short",
        "bad-length",
        "bad-chunk",
        "too-many-trailers",
    ],
)
def test_a_broken_answer_is_unavailable_and_its_connection_dropped(
    scripted: Scripted, answer: bytes, why: str
) -> None:
    scripted.answers = [answer]
    scripted.closing = {0}  # what it wrote is all there is
    with client_of(scripted) as client:
        with pytest.raises(Unavailable, match=why) as caught:
            client.call("GET", "/a")
        assert caught.value.code == UNREACHABLE
        assert client.call("GET", "/b") == {"n": 1}
    assert scripted.connections == [1, 2]


def test_threads_share_the_kept_connections(scripted: Scripted) -> None:
    errors: list[BaseException] = []
    with client_of(scripted) as client:

        def calls() -> None:
            try:
                for _ in range(20):
                    assert client.call("GET", "/a") == {"n": 1}
            except BaseException as exc:  # the test's thread reports it
                errors.append(exc)

        threads = [threading.Thread(target=calls) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert len(scripted.requests) == 120
    assert len(set(scripted.connections)) <= 6


def test_a_connection_sends_host_length_and_headers_and_reports_being_closed(
    scripted: Scripted,
) -> None:
    port = int(scripted.url.rsplit(":", 1)[1])
    conn = Connection("http", "127.0.0.1", port, timeout=5)
    assert not conn.connected
    assert conn.request("POST", "/x?a=1", {"X-Key": "v"}, None) == (200, b'{"n": 1}')
    assert conn.connected
    head = scripted.requests[0][1].decode()
    assert head.split("\r\n") == [
        "POST /x?a=1 HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "X-Key: v",
        "Content-Length: 0",
    ]
    scripted.answers = [OK, CLOSE]
    with pytest.raises(RemoteDisconnected):
        conn.request("GET", "/y", {}, None)
    assert not conn.connected  # an error leaves nothing half read to reuse
    assert isinstance(RemoteDisconnected("x"), ProtocolError)


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for `localhost` that no authority signed, and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_checks_the_certificate_as_the_default_context_does(
    scripted: Scripted, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        number = 0
        while True:
            try:
                plain, _ = listener.accept()
            except OSError:
                return
            number += 1
            try:
                conn = server_side.wrap_socket(plain, server_side=True)
            except (OSError, ssl.SSLError):
                plain.close()  # a client that refused the certificate
                continue
            threading.Thread(target=scripted.serve, args=(conn, number), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        # A certificate no known authority signed is refused, as http.client refuses it.
        client = RpcClient([f"https://127.0.0.1:{port}"], "t", timeout=5)
        with client, pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
            client.call("GET", "/a")
        # Trusted, and checked against the name it was asked for: kept alive over TLS.
        trusting = ssl.create_default_context(cafile=str(cert))
        conn = Connection("https", "localhost", port, timeout=5, tls=trusting)
        assert conn.request("GET", "/b", {}, None) == (200, b'{"n": 1}')
        assert conn.request("GET", "/c", {}, None) == (200, b'{"n": 1}')
        conn.close()
        assert scripted.connections == [2, 2]
        assert scripted.requests[0][1].split(b"\r\n")[1] == f"Host: localhost:{port}".encode()
        elsewhere = Connection("https", "127.0.0.1", port, timeout=5, tls=trusting)
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            elsewhere.request("GET", "/d", {}, None)  # another name than the certificate's
    finally:
        listener.close()
