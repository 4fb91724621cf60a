"""HTTP/1.1 over one kept-alive socket: the wire of every client of the RPC kit, the
services' (`scheduler.rpc.client`) and the CLI's (`scheduler.cli.api`).

The standard library's `http.client` would do, but it costs both kinds of caller more
than the exchange itself. Importing it (with the `email` package it parses headers with)
costs about as much again as the interpreter's own start, and every command pays for it
on every run; and each answer is an `HTTPResponse` over a `makefile`, its headers read by
the `email` parser: two thirds of the CPU a call of the services' client cost
(bench/rpc_transport.py), and the web, the worker and the agents make one or more calls
a job. This is the part of it they use: one request at a time, an answer framed by
Content-Length or chunked encoding (or the connection's end), `Connection: close` (and
HTTP/1.0) honoured, the status line and headers bounded as `http.client` bounds them,
TLS through `ssl` for https only, with the default context's checks. Every error is an
OSError or a `ProtocolError` (a ValueError), and an error closes the connection: what
is left of a request or an answer is never read as the next one's.

Plain http talks through `_socket`, the C module under `socket`: `socket` itself (its
enums, `selectors`, `array`) costs a tenth of the interpreter's start, for nothing the
CLI uses, so the few lines of buffering that `makefile` would give are here (`_Reader`).
"""

from __future__ import annotations

import _socket

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    import ssl
    from collections.abc import Mapping

MAX_LINE = 65536  # bytes in the status line or one header (http.client's bound)
MAX_HEADERS = 100  # headers in an answer (http.client's bound)
_RECV = 262_144  # bytes a read asks for: a list answer of a few MB comes in few reads


class ProtocolError(ValueError):
    """The server's answer is not HTTP/1.x as it should be."""


class RemoteDisconnected(ProtocolError):
    """The server closed the connection before any byte of an answer: on a kept
    connection, most often one it closed while the connection sat idle."""


_tls: ssl.SSLContext | None = None


def tls_context() -> ssl.SSLContext:
    """The one TLS context of the process's connections: the default context (the
    system's certificate authorities, the host name checked), made once, for loading
    the authorities costs more than a handshake."""
    global _tls
    if _tls is None:
        import ssl

        _tls = ssl.create_default_context()
    return _tls


def _plain_connection(host: str, port: int, timeout: float) -> _socket.socket:
    """`socket.create_connection`: each address the name resolves to, in turn."""
    error: OSError | None = None
    # An ASCII name as bytes: a str would go through the IDNA codec, whose import (with
    # `unicodedata` and `stringprep`) costs more than the connection.
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"{host}: no address to connect to")


class _Reader:
    """Buffered reads of a socket (plain or TLS): lines, exact sizes, or all to the end."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def _fill(self) -> bool:
        chunk = self._sock.recv(_RECV)
        self._buf += chunk
        return bool(chunk)

    def readline(self, limit: int) -> bytes:
        """Up to and with the next newline, at most `limit` bytes; less at the end."""
        start = 0
        while True:
            at = self._buf.find(b"\n", start, limit)
            if at >= 0:
                return self._take(at + 1)
            if len(self._buf) >= limit:
                return self._take(limit)
            start = len(self._buf)
            if not self._fill():
                return self._take(len(self._buf))

    def read(self, size: int) -> bytes:
        """`size` bytes, or fewer if the connection ends first."""
        if len(self._buf) >= size:
            return self._take(size)
        out = bytearray(size)
        have = len(self._buf)
        out[:have] = self._buf
        self._buf.clear()
        view = memoryview(out)
        while have < size:
            got = self._sock.recv_into(view[have:], min(size - have, 4 * _RECV))
            if not got:
                break
            have += got
        view.release()
        del out[have:]
        return bytes(out)

    def read_all(self) -> bytes:
        while self._fill():
            pass
        return self._take(len(self._buf))

    def _take(self, size: int) -> bytes:
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data


class Connection:
    """One connection to (scheme, host, port), opened at its first request and kept
    between requests while the server keeps it; one request at a time (one thread)."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        *,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.scheme, self.host, self.port, self.timeout = scheme, host, port, timeout
        self._tls = tls  # none: `tls_context()`
        self._sock: _socket.socket | None = None
        self._file: _Reader | None = None
        self._wait = timeout  # the socket's timeout now
        name = host if ":" not in host else f"[{host}]"
        default = 443 if scheme == "https" else 80
        self._host = f"Host: {name}" + ("" if port == default else f":{port}")

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def _connect(self, timeout: float) -> None:
        sock: _socket.socket
        if self.scheme == "https":
            import socket  # only for TLS: plain http on loopback never pays for them

            plain = socket.create_connection((self.host, self.port), timeout=timeout)
            try:
                plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                tls = self._tls if self._tls is not None else tls_context()
                sock = tls.wrap_socket(plain, server_hostname=self.host)
            except BaseException:
                plain.close()
                raise
        else:
            sock = _plain_connection(self.host, self.port, timeout)
        self._sock, self._file, self._wait = sock, _Reader(sock), timeout

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """The answer's status and body; the connection stays open unless the server
        says it closes it, or something failed. `timeout`: this request's wait (to
        connect, and for each read), instead of the connection's."""
        wait = self.timeout if timeout is None else timeout
        try:
            if self._sock is None:
                self._connect(wait)
            elif wait != self._wait:
                self._sock.settimeout(wait)
                self._wait = wait
            assert self._sock is not None
            lines = [f"{method} {target} HTTP/1.1", self._host]
            lines += [f"{name}: {value}" for name, value in headers.items()]
            if body is not None or method in ("POST", "PUT", "PATCH"):
                lines.append(f"Content-Length: {len(body or b'')}")
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            self._sock.sendall(head + body if body else head)
            status, version, fields = self._read_head()
            data = self._read_body(method, status, fields)
        except BaseException:
            self.close()  # half a request or an answer: nothing to keep
            raise
        closing = fields.get("connection", "").lower()
        if "close" in closing or (version == "HTTP/1.0" and "keep-alive" not in closing):
            self.close()
        return status, data

    def _reader(self) -> _Reader:
        if self._file is None:
            raise ProtocolError("the connection is closed")
        return self._file

    def _line(self) -> bytes:
        line = self._reader().readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("a header line is too long")
        return line

    def _read_head(self) -> tuple[int, str, dict[str, str]]:
        while True:
            line = self._line()
            if not line:
                raise RemoteDisconnected("the server closed the connection without answering")
            version, _, rest = line.decode("latin-1").strip().partition(" ")
            code = rest.partition(" ")[0]
            if not version.startswith("HTTP/1.") or not (code.isdigit() and len(code) == 3):
                raise ProtocolError(f"not an HTTP answer: {line[:80]!r}")
            fields: dict[str, str] = {}
            for _ in range(MAX_HEADERS + 1):
                header = self._line()
                if header in (b"\r\n", b"\n", b""):
                    break
                name, _, value = header.decode("latin-1").partition(":")
                fields[name.strip().lower()] = value.strip()
            else:
                raise ProtocolError("too many headers")
            if 100 <= int(code) < 200:
                continue  # an interim answer: the real one follows
            return int(code), version, fields

    def _read_body(self, method: str, status: int, fields: dict[str, str]) -> bytes:
        if method == "HEAD" or status in (204, 304):
            return b""
        if "chunked" in fields.get("transfer-encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size_line = self._line().split(b";", 1)[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_line[:20]!r}") from None
                if size == 0:
                    for _ in range(MAX_HEADERS + 1):  # trailers, bounded as headers are
                        if self._line() in (b"\r\n", b"\n", b""):
                            return b"".join(parts)
                    raise ProtocolError("too many trailers")
                parts.append(self._exactly(size))
                self._line()
        length = fields.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length {length[:20]!r}")
            return self._exactly(int(length))
        data = self._reader().read_all()  # framed by the connection's end
        self.close()
        return data

    def _exactly(self, size: int) -> bytes:
        data = self._reader().read(size)
        if len(data) != size:
            raise ProtocolError("the server closed the connection mid-answer")
        return data
