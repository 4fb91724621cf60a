"""The web API client the commands share (httpx): bearer token, `next` pages followed,
and HTTP errors turned into exceptions that carry the server's message."""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

import httpx

from scheduler.cli.config import CliConfig


class ApiError(Exception):
    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Unauthorized(ApiError):
    pass


class NotFound(ApiError):
    pass


class Refused(ApiError):
    """400: the server understood and said no (the controller's message)."""


class Unavailable(ApiError):
    pass


class ApiClient:
    def __init__(
        self,
        config: CliConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.base = config.api_url.rstrip("/") + "/"
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {config.token}", "Accept": "application/json"},
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def submit_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._object("POST", "api/v1/jobs", json=spec)

    def get_job(self, job_id: int) -> dict[str, Any]:
        return self._object("GET", f"api/v1/jobs/{job_id}")

    def cancel_job(self, job_id: int, signal: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {} if signal is None else {"signal": signal}
        return self._object("POST", f"api/v1/jobs/{job_id}/cancel", json=body)

    def list_jobs(self, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return self._list("api/v1/jobs", params)

    def queue(self) -> list[dict[str, Any]]:
        return self._list("api/v1/queue")

    def nodes(self) -> list[dict[str, Any]]:
        return self._list("api/v1/nodes")

    def partitions(self) -> list[dict[str, Any]]:
        return self._list("api/v1/partitions")

    def _object(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        data = self._request(method, urljoin(self.base, path), **kw)
        if not isinstance(data, dict):
            raise ApiError(f"unexpected answer from {path}: not a JSON object")
        return data

    def _list(self, path: str, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        url: str | None = urljoin(self.base, path)
        query = params
        seen: set[str] = set()
        while url is not None:
            if url in seen:
                raise ApiError(f"the server's pages of {path} loop back to {url}")
            seen.add(url)
            page = self._request("GET", url, params=query)
            query = None  # `next` already carries the filters
            if not isinstance(page, dict) or not isinstance(page.get("results"), list):
                raise ApiError(f"unexpected answer from {path}: no results list")
            items.extend(page["results"])
            following = page.get("next")
            url = urljoin(url, following) if following else None
        return items

    def _request(self, method: str, url: str, **kw: Any) -> Any:
        try:
            response = self._http.request(method, url, **kw)
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot reach the Spur API at {self.base}: {exc}") from exc
        if response.status_code < 400:
            try:
                return response.json()
            except ValueError as exc:
                raise ApiError(f"the Spur API answered {url} with something not JSON") from exc
        detail = _detail(response)
        status = response.status_code
        if status == 401:
            raise Unauthorized(
                f"authentication failed ({detail}): check SPUR_TOKEN or the token in "
                "~/.config/spur/config.toml",
                status=status,
            )
        if status == 404:
            raise NotFound(detail, status=status)
        if status == 400:
            raise Refused(detail, status=status)
        if status == 503:
            raise Unavailable(f"the scheduler is unavailable: {detail}", status=status)
        raise ApiError(f"the Spur API answered {status}: {detail}", status=status)


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(data, dict) and "detail" in data:
        return str(data["detail"])
    return str(data)
