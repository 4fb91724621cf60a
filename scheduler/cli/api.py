"""The web API client the commands share: the RPC kit's client (`scheduler.rpc.client`)
with the user's token, `next` pages followed, and the kit's errors carrying the
server's message."""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

import httpx

from scheduler.cli.config import CliConfig
from scheduler.rpc.client import UNREACHABLE, RpcClient
from scheduler.rpc.errors import RpcError, Unauthorized, Unavailable


class ApiClient:
    def __init__(
        self,
        config: CliConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.base = config.api_url.rstrip("/") + "/"
        self._rpc = RpcClient(
            [self.base],
            config.token,
            timeout=timeout_s,
            transport=transport,
            headers={"Accept": "application/json"},
        )

    def close(self) -> None:
        self._rpc.close()

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

    def queue(self) -> list[dict[str, Any]]:
        return self.pages("api/v1/queue")

    def nodes(self) -> list[dict[str, Any]]:
        return self.pages("api/v1/nodes")

    def partitions(self) -> list[dict[str, Any]]:
        return self.pages("api/v1/partitions")

    # -- the two shapes of answer, for any path under the API (every command's calls) --

    def object(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """The JSON object `path` (relative to the API's base URL) answers."""
        data = self._request(method, urljoin(self.base, path), **kw)
        if not isinstance(data, dict):
            raise RpcError(f"unexpected answer from {path}: not a JSON object")
        return data

    def pages(self, path: str, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Every item of a paged list answer (`{"results": [...], "next": url}`)."""
        items: list[dict[str, Any]] = []
        url: str | None = urljoin(self.base, path)
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
            url = urljoin(url, following) if following else None
        return items

    def _request(self, method: str, url: str, **kw: Any) -> Any:
        try:
            return self._rpc.call(method, url, **kw)
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
