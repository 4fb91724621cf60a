"""The HTTP client for the agent API, used by the Celery workers (`spur.launch_job`,
`spur.signal_job`).

Two kinds of failure, because the caller must treat them differently: `AgentUnavailable`
(no answer, a timeout, a 5xx) is worth retrying with backoff, since launch and signal
are idempotent; `AgentRefused` (a 4xx: bad token, malformed payload, wrong node) will
fail the same way every time.
"""

from __future__ import annotations

from typing import Any

import httpx


class AgentError(Exception):
    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class AgentUnavailable(AgentError):
    """The agent could not be reached or failed (retry)."""


class AgentRefused(AgentError):
    """The agent refused the request (do not retry)."""


class AgentClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def launch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`{"accepted": true, "duplicate": bool}`; a duplicate is success, not an error."""
        answer: dict[str, Any] = self._request(
            "POST", f"/v1/jobs/{int(payload['job_id'])}/launch", json=payload
        )
        return answer

    def signal(
        self, job_id: int, *, attempt: int, signal: int, kill_after_s: float | None = None
    ) -> dict[str, Any]:
        """`{"delivered": bool}`: false when the job does not run on that node (any more)."""
        body: dict[str, Any] = {"attempt": attempt, "signal": signal}
        if kill_after_s is not None:
            body["kill_after_s"] = kill_after_s
        answer: dict[str, Any] = self._request("POST", f"/v1/jobs/{int(job_id)}/signal", json=body)
        return answer

    def jobs(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self._request("GET", "/v1/jobs")["jobs"]
        return jobs

    def health(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._request("GET", "/v1/health")
        return answer

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AgentUnavailable(f"{self.base_url}: {exc}") from exc
        if response.status_code >= 500:
            raise AgentUnavailable(_message(response), status=response.status_code)
        if response.status_code >= 400:
            raise AgentRefused(_message(response), status=response.status_code)
        try:
            return response.json()
        except ValueError as exc:
            raise AgentUnavailable(f"{self.base_url}: answer is not JSON") from exc


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text.strip()[:200]}"
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return f"HTTP {response.status_code}"
