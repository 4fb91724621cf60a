"""The client half: one HTTP client for every internal caller and for the CLI.

`RpcClient(urls, token)` knows every replica of a service and moves on to the next when
one cannot be reached or has no leader (503); it remembers the one that answered. With
`retry_for_s`, it keeps trying (exponential backoff, through tenacity) while every
replica is unavailable, e.g. during an election; only do that for calls that are safe
to repeat, which every call of the controller and the agent is (submissions carry an
idempotency key, reports are idempotent by (job, attempt)). An answer's status becomes
the same error the server raised (`scheduler.rpc.errors`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import httpx
import orjson

from scheduler.rpc.errors import UNREACHABLE, RpcError, Unavailable, error_for


class RpcClient:
    def __init__(
        self,
        urls: Sequence[str] | str,
        token: str,
        *,
        timeout: float = 10.0,
        retry_for_s: float = 0.0,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("no URL configured")
        self.urls = [u.strip().rstrip("/") for u in urls]
        self.retry_for_s = retry_for_s
        self._preferred = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {token}", **(headers or {})},
            timeout=timeout,
            transport=transport,
            limits=httpx.Limits(max_keepalive_connections=32, max_connections=64),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of `path` (relative to a replica's URL, or absolute)."""
        return self._call(answer, method, path, **kwargs)

    def call_bytes(self, method: str, path: str, **kwargs: Any) -> bytes:
        """The same call, its answer's body as it came: for a caller that passes the JSON
        on without reading it (the web's list answers). Errors are as `call` raises them."""
        body: bytes = self._call(answer_bytes, method, path, **kwargs)
        return body

    def _call(
        self, read: Callable[[httpx.Response], Any], method: str, path: str, **kwargs: Any
    ) -> Any:
        if self.retry_for_s <= 0:
            return self._once(read, method, path, **kwargs)
        import tenacity  # only callers that retry pay for the import (the CLI does not)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Unavailable),
            stop=tenacity.stop_after_delay(self.retry_for_s),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            reraise=True,
        )
        return retrying(self._once, read, method, path, **kwargs)

    def _once(
        self, read: Callable[[httpx.Response], Any], method: str, path: str, **kwargs: Any
    ) -> Any:
        if path.startswith(("http://", "https://")):
            return read(self._send(method, path, **kwargs))
        with self._lock:
            start = self._preferred
        last: Unavailable | None = None
        for step in range(len(self.urls)):
            index = (start + step) % len(self.urls)
            try:
                response = self._send(method, self.urls[index] + path, **kwargs)
            except Unavailable as exc:
                last = last if last is not None and last.code != UNREACHABLE else exc
                continue
            if response.status_code == 503:  # a replica without a leader: try another
                try:
                    answer(response)
                except Unavailable as exc:
                    last = exc
                continue
            with self._lock:
                self._preferred = index
            return read(response)
        assert last is not None
        raise last

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{url}: {exc or type(exc).__name__}", code=UNREACHABLE) from exc


def message_of(response: httpx.Response) -> str:
    try:
        body = orjson.loads(response.content)
    except ValueError:
        return response.text.strip()[:200] or f"HTTP {response.status_code}"
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return f"HTTP {response.status_code}"


def answer(response: httpx.Response) -> Any:
    """The JSON of a successful answer; the error the server raised otherwise."""
    if response.status_code < 400:
        try:
            return orjson.loads(response.content)
        except ValueError:
            raise Unavailable(f"{response.url}: the answer is not JSON") from None
    raise_error(response)


def answer_bytes(response: httpx.Response) -> bytes:
    """The body of a successful answer as it came; the error the server raised otherwise."""
    if response.status_code < 400:
        return response.content
    raise_error(response)


def raise_error(response: httpx.Response) -> NoReturn:
    """The error an answer of 400 or more stands for, raised."""
    code = ""
    try:
        body = orjson.loads(response.content)
        if isinstance(body, dict):
            code = str(body.get("code", ""))
    except ValueError:
        pass
    raise error_for(response.status_code, message_of(response), code)


__all__ = ["UNREACHABLE", "RpcClient", "RpcError", "answer", "answer_bytes", "message_of"]
