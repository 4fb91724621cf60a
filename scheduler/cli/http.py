"""HTTP/1.1 over one kept-alive socket, for the CLI's requests to the web API.

The standard library's `http.client` would do, but importing it (with the `email`
package it parses headers with) costs about as much again as the interpreter's own
start, and every command pays for it on every run. This is the part of it the CLI
uses: one request at a time, an answer framed by Content-Length or chunked encoding (or
the connection's end), `Connection: close` honoured, TLS through `ssl` for https only.
Every error is an OSError or a `ProtocolError` (a ValueError).
"""

from __future__ import annotations

import socket
from typing import Any

MAX_LINE = 65536  # bytes in the status line or one header
MAX_HEADERS = 100


class ProtocolError(ValueError):
    """The server's answer is not HTTP/1.x as it should be."""


class Connection:
    def __init__(self, scheme: str, host: str, port: int, *, timeout: float) -> None:
        self.scheme, self.host, self.port, self.timeout = scheme, host, port, timeout
        self._sock: socket.socket | None = None
        self._file: Any = None  # the socket's buffered reader

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.scheme == "https":
            import ssl  # only for TLS: plain http on loopback never pays for it

            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        self._sock, self._file = sock, sock.makefile("rb")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def request(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        """The answer's status and body; the connection stays open unless the server
        says it closes it."""
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        host = self.host if ":" not in self.host else f"[{self.host}]"
        default = 443 if self.scheme == "https" else 80
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}" + (
            "" if self.port == default else f":{self.port}")]  # fmt: skip
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._sock.sendall(head + (body or b""))
        status, version, fields = self._read_head()
        data = self._read_body(method, status, fields)
        closing = fields.get("connection", "").lower()
        if "close" in closing or (version == "HTTP/1.0" and "keep-alive" not in closing):
            self.close()
        return status, data

    def _line(self) -> bytes:
        line: bytes = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("a header line is too long")
        return line

    def _read_head(self) -> tuple[int, str, dict[str, str]]:
        while True:
            line = self._line()
            if not line:
                raise ProtocolError("the server closed the connection without answering")
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
                    while self._line() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self._exactly(size))
                self._line()
        length = fields.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length {length[:20]!r}")
            return self._exactly(int(length))
        data: bytes = self._file.read()  # framed by the connection's end
        self.close()
        return data

    def _exactly(self, size: int) -> bytes:
        data: bytes = self._file.read(size)
        if len(data) != size:
            raise ProtocolError("the server closed the connection mid-answer")
        return data
