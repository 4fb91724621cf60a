"""The web API client the commands share: the user's token, `next` pages followed, and
the RPC kit's errors (`scheduler.rpc.errors`) carrying the server's message.

It speaks HTTP/1.1 through the RPC kit's own wire (`scheduler.rpc.http`), one kept-alive
connection per server, and imports nothing heavy: every command pays for its client at
start-up, and a command's whole run should cost little more than the interpreter's own start
(tests/scheduler/cli/test_startup.py, bench/cli.py). The errors are those the RPC kit's
client (`scheduler.rpc.client`) gives the services, with the same messages.
"""

from __future__ import annotations

from scheduler.cli import wire
from scheduler.cli.config import CliConfig
from scheduler.rpc.errors import UNREACHABLE, RpcError, Unauthorized, Unavailable, error_for
from scheduler.rpc.http import Connection

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from typing import Any

# Errors of a kept-alive connection the server closed between two requests: worth one
# more try on a new connection for a request that is safe to repeat.
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_ERROR_TEXT = 200


class ApiClient:
    def __init__(self, config: CliConfig, *, timeout_s: float = 30.0) -> None:
        self.base = config.api_url.rstrip("/") + "/"
        self.timeout_s = timeout_s
        self._headers = {
            "Authorization": f"Bearer {config.token}",
            "Accept": "application/json",
            "User-Agent": "spur-cli",
        }
        self._connections: dict[tuple[str, str], Connection] = {}

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.object("POST", "api/v1/jobs", json=spec)

    def get_job(self, job_id: int) -> dict[str, Any]:
        return self.object("GET", f"api/v1/jobs/{job_id}")

    def act(self, job_id: int, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A job action of the contract (cancel, hold, release, requeue, requeuehold)."""
        return self.object("POST", f"api/v1/jobs/{job_id}/{action}", json=body or {})

    def cancel_job(self, job_id: int, signal: int | None = None) -> dict[str, Any]:
        return self.act(job_id, "cancel", {} if signal is None else {"signal": signal})

    def list_jobs(self, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return self.pages("api/v1/jobs", params)

    def queue(self, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return self.pages("api/v1/queue", params)

    def nodes(self) -> list[dict[str, Any]]:
        return self.pages("api/v1/nodes")

    def partitions(self) -> list[dict[str, Any]]:
        return self.pages("api/v1/partitions")

    # -- the two shapes of answer, for any path under the API (every command's calls) --

    def object(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """The JSON object `path` (relative to the API's base URL) answers. Keywords:
        `json` (the body) and `params` (the query)."""
        data = self._request(method, wire.join(self.base, path), **kw)
        if not isinstance(data, dict):
            raise RpcError(f"unexpected answer from {path}: not a JSON object")
        return data

    def pages(self, path: str, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Every item of a paged list answer (`{"results": [...], "next": url}`)."""
        items: list[dict[str, Any]] = []
        url: str | None = wire.join(self.base, path)
        query = params
        seen: set[str] = set()
        while url is not None:
            if url in seen:
                raise RpcError(f"the server's pages of {path} loop back to {url}")
            seen.add(url)
            page = self._request("GET", url, params=query)
            query = None  # `next` already carries the filters
            if not isinstance(page, dict) or not isinstance(page.get("results"), list):
                raise RpcError(f"unexpected answer from {path}: no results list")
            items.extend(page["results"])
            following = page.get("next")
            url = wire.join(url, following) if following else None
        return items

    def columns(self, path: str, params: dict[str, str]) -> tuple[int, dict[str, list[Any]]]:
        """A list answer in columns (`shape=runs`, the fields `params` names: a column of
        long runs of one value comes as its runs, `contract.runs`): how many jobs, and
        each field's values over every page (`next` followed)."""
        from scheduler.core.contract.runs import decode_column

        url: str | None = wire.join(self.base, path)
        query: dict[str, str] | None = {**params, "shape": "runs"}
        out: dict[str, list[Any]] = {}
        count = 0
        seen: set[str] = set()
        while url is not None:
            if url in seen:
                raise RpcError(f"the server's pages of {path} loop back to {url}")
            seen.add(url)
            page = self._request("GET", url, params=query)
            query = None  # `next` already carries the filters
            columns = page.get("columns") if isinstance(page, dict) else None
            if not isinstance(columns, dict) or not isinstance(page.get("n"), int):
                raise RpcError(f"unexpected answer from {path}: no columns")
            for name, column in columns.items():
                try:
                    values = decode_column(column, page["n"])
                except ValueError as exc:
                    raise RpcError(f"unexpected answer from {path}: column {name}: {exc}") from None
                if name in out:
                    out[name].extend(values)
                elif count:
                    raise RpcError(f"unexpected answer from {path}: {name} only on a later page")
                else:
                    out[name] = values
            count += page["n"]
            following = page.get("next")
            url = wire.join(url, following) if following else None
        return count, out

    # -- HTTP --------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,  # noqa: A002 - the keyword every HTTP client takes for the body
        params: dict[str, str] | None = None,
    ) -> Any:
        try:
            status, body = self._exchange(method, url, json, params)
            return _answer(url, status, body)
        except Unauthorized as exc:
            raise Unauthorized(
                f"authentication failed ({exc.message}): check SPUR_TOKEN or the token in "
                "~/.config/spur/config.toml",
                code=exc.code,
            ) from None
        except Unavailable as exc:
            if exc.code == UNREACHABLE:
                message = f"cannot reach the Spur API at {self.base}: {exc.message}"
            elif exc.status == 503:
                message = f"the scheduler is unavailable: {exc.message}"
            else:
                message = f"the Spur API answered {exc.status}: {exc.message}"
            raise Unavailable(message, code=exc.code, status=exc.status) from None

    def _exchange(
        self, method: str, url: str, body: Any, params: dict[str, str] | None
    ) -> tuple[int, bytes]:
        try:
            parts = wire.Url(url)
        except ValueError as exc:
            raise Unavailable(str(exc), code=UNREACHABLE) from None
        if parts.scheme not in ("http", "https") or not parts.host:
            raise Unavailable(f"{url}: not an http(s) URL", code=UNREACHABLE)
        target = parts.path or "/"
        query = "&".join(q for q in (parts.query, wire.query(params or {})) if q)
        if query:
            target = f"{target}?{query}"
        headers = dict(self._headers)
        payload: bytes | None = None
        if body is not None:
            payload = json_dumps(body)
            headers["Content-Type"] = "application/json"
        key = (parts.scheme, parts.netloc)
        for attempt in (1, 2):
            connection = self._connection(key, parts.host, parts.port)
            reused = connection.connected
            try:
                return connection.request(method, target, headers, payload)
            except (OSError, ValueError) as exc:  # ValueError: http.ProtocolError
                self._drop(key)
                # A kept-alive connection the server closed meanwhile: once more, anew.
                if reused and attempt == 1 and method in _IDEMPOTENT:
                    continue
                raise Unavailable(f"{url}: {exc or type(exc).__name__}", code=UNREACHABLE) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection(self, key: tuple[str, str], host: str, port: int | None) -> Connection:
        connection = self._connections.get(key)
        if connection is None:
            scheme = key[0]
            default = 443 if scheme == "https" else 80
            connection = Connection(scheme, host, port or default, timeout=self.timeout_s)
            self._connections[key] = connection
        return connection

    def _drop(self, key: tuple[str, str]) -> None:
        connection = self._connections.pop(key, None)
        if connection is not None:
            connection.close()


def json_dumps(value: Any) -> bytes:
    return wire.dumps(value)


def _answer(url: str, status: int, body: bytes) -> Any:
    """The JSON of a successful answer; the error the server raised otherwise (as
    `scheduler.rpc.client.answer` reads an answer)."""
    try:
        data = wire.loads(body) if body else None
        parsed = body != b""
    except ValueError:
        data, parsed = None, False
    if status < 400:
        if not parsed:
            raise Unavailable(f"{url}: the answer is not JSON")
        return data
    if parsed and isinstance(data, dict) and "detail" in data:
        message = str(data["detail"])
    elif parsed:
        message = f"HTTP {status}"
    else:
        message = body.decode(errors="replace").strip()[:_MAX_ERROR_TEXT] or f"HTTP {status}"
    code = str(data.get("code", "")) if isinstance(data, dict) else ""
    raise error_for(status, message, code)
